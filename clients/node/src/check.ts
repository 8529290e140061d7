/**
 * check(): the Python enforcer's decision for one request (enforcer/check.py,
 * counting.py, fitting.py, fail_mode.py), from what a follower holds.
 *
 * Every applicable budget counted against its verdict (zero when the verdict is of
 * another period), in the order the Python enforcer walks them; the refusing counter
 * chosen as it chooses it; the refusal bodies of enforcer/refusals.py (see refusals.ts).
 *
 * An admitted request holds its worst case and takes its rate until settle() (its usage
 * event) or release(); peek() answers as check() would, holding and taking nothing.
 */
import { Context, MAX_TOKENS_PER_EVENT, RequestContext } from "./context";
import { compose } from "./ids";
import { DAY_US, isoUs, periodEndUs, periodKey } from "./periods";
import { Budget, CounterVerdict, FollowerState, spentAt } from "./state";
import { BudgetRaise, raisedLimits, raiseJSON } from "./raises";
import { counterPeriod, Holds } from "./holds";
import { Charges, RateBuckets, refund } from "./rates";
import { newUsageEvent, UsageEvent, UsageEventFields } from "./usage";
import { RollingSpend } from "./rolling";
import { respond, Response, spendHeaderOf } from "./refusals";

export const REQUEST_BYTES_PER_TOKEN = 3;

/** The enforcer settings a check reads (enforcer/config.py, same defaults). */
export interface CheckConfig {
  failMode: "open" | "closed";
  graceS: number;
  refusalStyle: "default" | "native" | "seed000";
  defaultMaxOutputTokens: number;
  unpricedModels: "refuse" | "allow_free";
  replicas: number;
  inFlightRetryAfterS: number;
  failClosedRetryAfterS: number;
  /** new session ids a key may open per UTC day (null: no bound) */
  maxSessionsPerKey: number | null;
  /** a hold neither settled nor released is dropped after this long */
  holdTimeoutS: number;
}

export const DEFAULT_CHECK_CONFIG: CheckConfig = {
  failMode: "open",
  graceS: 900,
  refusalStyle: "default",
  defaultMaxOutputTokens: 8192,
  unpricedModels: "refuse",
  replicas: 1,
  inFlightRetryAfterS: 5,
  failClosedRetryAfterS: 30,
  maxSessionsPerKey: 1000,
  holdTimeoutS: 600,
};

/** The bound on new session ids per key (enforcer/sessions.py SessionBound): a session no
 * verdict knows yet would get a counter of its own for every id a client makes up, so a key
 * (org, secret) may open at most `maxSessionsPerKey` of them per UTC day, per process. */
export class SessionBound {
  private sessions = new Map<string, Set<string>>();
  private day = -1;

  constructor(readonly maxSessions: number | null) {}

  /** May `ctx`'s session have a counter of its own? A reserving check counts it (a peek
   * only asks). */
  admits(ctx: Context, nowUs: number, reserve: boolean): boolean {
    if (this.maxSessions === null) return true;
    const day = Math.floor(nowUs / DAY_US);
    if (day !== this.day) {
      this.sessions = new Map();
      this.day = day;
    }
    const key = compose([ctx.org, ctx.secret]);
    let seen = this.sessions.get(key);
    if (seen === undefined) {
      if (!reserve) return true;
      this.sessions.set(key, (seen = new Set()));
    }
    if (seen.has(ctx.session)) return true;
    if (seen.size >= this.maxSessions) return false;
    if (reserve) seen.add(ctx.session);
    return true;
  }
}

export const STATE_NAMES = [
  "ok",
  "alert",
  "exceeded",
  "in_flight",
  "failed_open",
  "failed_closed",
  "too_large",
  "throttled",
  "unpriced",
  "too_many_sessions",
] as const;
export type CounterState = (typeof STATE_NAMES)[number];
const OK = 0;
const ALERT = 1;
const EXCEEDED = 2;
const FAILED_OPEN = 4;
const FAILED_CLOSED = 5;
const TOO_LARGE = 6;
const IN_FLIGHT = 3;
const THROTTLED = 7;
const UNPRICED = 8;
const SESSIONS = 9;
const NEVER_US = 2 ** 62;

/** One budget with what a check reads of it (enforcer/plans.py Plan). */
export interface Plan {
  budget: Budget;
  enforce: boolean;
  holdable: boolean;
  /** an enforce USD budget refusing a model without a price (its own or the default policy) */
  refuseUnpriced: boolean;
  alertMin: number | null;
}

function planOf(budget: Budget, unpricedDefault: string): Plan {
  const enforce = budget.action === "enforce";
  return {
    budget,
    enforce,
    holdable: enforce && (budget.limitNanos !== null || budget.limitTokens !== null || budget.limitRequests !== null),
    refuseUnpriced: enforce && budget.limitNanos !== null && (budget.unpriced ?? unpricedDefault) === "refuse",
    alertMin: budget.alertAt.length > 0 ? Math.min(...budget.alertAt) : null,
  };
}

/** Every applicable counter as the check saw it (enforcer/counters.py CounterStatus). */
export class CounterStatus {
  heldNanos = 0;
  heldTokens = 0;
  heldRequests = 0;

  constructor(
    readonly plan: Plan,
    readonly scopeValues: string[],
    readonly period: string,
    public endUs: number | null,
    readonly verdict: CounterVerdict | null,
    readonly spentNanos: number,
    readonly spentTokens: number,
    readonly spentRequests: number,
    public stateIndex: number,
    /** the raise in force for the counter (its limits are the ones checked), or null */
    readonly granted: BudgetRaise | null = null,
  ) {
    const budget = plan.budget;
    [this.limitNanos, this.limitTokens, this.limitRequests] =
      granted === null
        ? [budget.limitNanos, budget.limitTokens, budget.limitRequests]
        : raisedLimits(granted, budget.limitNanos, budget.limitTokens, budget.limitRequests);
  }

  /** the limits checked: the budget's, or those its raise gives */
  readonly limitNanos: number | null;
  readonly limitTokens: number | null;
  readonly limitRequests: number | null;

  get state(): CounterState {
    return STATE_NAMES[this.stateIndex];
  }
  get budgetId(): string {
    return this.plan.budget.budgetId;
  }
  get counter(): string {
    return compose([this.plan.budget.budgetId, ...this.scopeValues]);
  }

  usedFraction(): number {
    return usedFractionOf(this, this.spentNanos, this.spentTokens, this.spentRequests);
  }

  remaining(): { nanos: number | null; tokens: number | null; requests: number | null } {
    const left = (limit: number | null, used: number): number | null => (limit === null ? null : Math.max(0, limit - used));
    return {
      nanos: left(this.limitNanos, this.spentNanos + this.heldNanos),
      tokens: left(this.limitTokens, this.spentTokens + this.heldTokens),
      requests: left(this.limitRequests, this.spentRequests + this.heldRequests),
    };
  }

  /** The counter as the sidecar's JSON shows it (without the forecast and raise fields). */
  toJSON(): Record<string, unknown> {
    const budget = this.plan.budget;
    return {
      budget_id: budget.budgetId,
      scope: budget.scope,
      scope_values: [...this.scopeValues],
      counter: this.counter,
      action: this.plan.enforce ? "enforce" : "warn",
      window: budget.window.spec,
      period: this.period,
      state: this.state,
      spent_nanos: this.spentNanos,
      spent_tokens: this.spentTokens,
      spent_requests: this.spentRequests,
      held_nanos: this.heldNanos,
      held_tokens: this.heldTokens,
      held_requests: this.heldRequests,
      limit_nanos: this.limitNanos,
      limit_tokens: this.limitTokens,
      limit_requests: this.limitRequests,
      base_limit_nanos: budget.limitNanos,
      base_limit_tokens: budget.limitTokens,
      base_limit_requests: budget.limitRequests,
      raise: this.granted === null ? null : raiseJSON(this.granted),
      remaining: this.remaining(),
      used_pct: roundHalfEven(this.usedFraction() * 100, 2),
      reset_at: isoUs(this.endUs),
      as_of: this.verdict === null ? null : isoUs(this.verdict.asOfUs),
      seq: this.verdict === null ? null : this.verdict.seq,
    };
  }
}

/** Python's round(x, places) of a non-negative double: its exact decimal value rounded to
 * `places`, ties to even (toFixed(60) is exact for the values a percentage takes). */
export function roundHalfEven(x: number, places: number): number {
  const [whole, fraction] = x.toFixed(60).split(".");
  const kept = BigInt(whole + fraction.slice(0, places));
  const rest = fraction.slice(places);
  const half = "5".padEnd(rest.length, "0");
  const up = rest > half || (rest === half && kept % 2n === 1n);
  return Number(up ? kept + 1n : kept) / 10 ** places;
}

export function usedFractionOf(row: CounterStatus, spentNanos: number, spentTokens: number, spentRequests: number): number {
  let used = 0;
  const limits: [number | null, number][] = [
    [row.limitNanos, spentNanos],
    [row.limitTokens, spentTokens],
    [row.limitRequests, spentRequests],
  ];
  for (const [limit, spent] of limits) {
    if (limit && spent / limit > used) used = spent / limit;
  }
  return used;
}

/** What the check decided (enforcer/decision.py Decision). */
export class Decision {
  requestNanos = -1;
  requestTokens = -1;
  replicas = 1;
  fittingMaxTokens: number | null = null;
  /** a throttled request: [tokens?, count, window µs, µs until it would pass] */
  throttle: [boolean, number, number, number] | null = null;
  /** what an admitted request took from the rate buckets (settle / release give it back) */
  charges: Charges | null = null;
  /** the hold of an admitted request (settle / release end it), null for none */
  holdId: number | null = null;
  private answer: Response | null = null;

  constructor(
    readonly ctx: Context,
    readonly decision: string,
    readonly outcome: "allowed" | "refused" | "failed_open" | "failed_closed",
    readonly counters: CounterStatus[],
    readonly refusalIndex: number,
    readonly nowUs: number,
    readonly config: CheckConfig,
    readonly reason: string | null = null,
  ) {}

  get allowed(): boolean {
    return this.outcome === "allowed" || this.outcome === "failed_open";
  }
  get refusing(): CounterStatus | null {
    return this.refusalIndex < 0 ? null : this.counters[this.refusalIndex];
  }
  get budgetId(): string | null {
    return this.refusing?.budgetId ?? null;
  }
  get response(): Response {
    if (this.answer === null) this.answer = respond(this);
    return this.answer;
  }
  get status(): number {
    return this.response.status;
  }
  get body(): Record<string, unknown> | null {
    return this.response.body;
  }
  get headers(): [string, string][] {
    return this.response.headers;
  }
  get retryAfter(): number | null {
    return this.response.retryAfter;
  }

  /** X-Spend-Budget of each counter past an alert threshold or a warn budget's limit. */
  warningHeaders(): [string, string][] {
    return this.counters
      .filter((r) => (r.stateIndex === ALERT || r.stateIndex === EXCEEDED) && r.verdict !== null)
      .map((r) => spendHeaderOf(r.plan.budget, r.state, r.endUs, r.usedFraction()));
  }

  refusingRows(): CounterStatus[] {
    return this.counters.filter(
      (r) =>
        (r.stateIndex === EXCEEDED ||
          r.stateIndex === IN_FLIGHT ||
          r.stateIndex === TOO_LARGE ||
          r.stateIndex === UNPRICED ||
          r.stateIndex === SESSIONS) &&
        r.plan.enforce,
    );
  }

  /** The UsageEvent of a refused request (zero tokens; `gatewayId` names the proxy), as the
   * Python enforcer's refusal_event builds it; null when the request was allowed. */
  refusalEvent(gatewayId: string, fields: Partial<UsageEventFields> = {}): UsageEvent | null {
    if (this.allowed) return null;
    const r = this.ctx.request;
    // a session past the key's bound: its id would open the very counter refused
    const sessionRefused = this.counters.some((row) => row.stateIndex === SESSIONS);
    return newUsageEvent({
      provider: r.provider || "unknown",
      api: r.api || "unknown",
      model: r.model || "unknown",
      secret_id: r.secret_id,
      org_id: r.org_id,
      gateway_id: gatewayId,
      input_tokens: 0,
      output_tokens: 0,
      status_code: this.status,
      occurred_at: this.nowUs,
      groups: [...(r.groups ?? [])],
      tags: { ...(r.tags ?? {}) },
      usage_source: "none",
      outcome: this.outcome,
      decision: this.decision,
      decision_budget_id: this.budgetId,
      project_id: r.project_id ?? null,
      grant_id: r.grant_id ?? null,
      permission_id: r.permission_id ?? null,
      user_id: r.user_id ?? null,
      session_id: sessionRefused ? null : (r.session_id ?? null),
      ...fields,
    });
  }

  /** Fields to set on the request's UsageEvent. */
  usageFields(): { outcome: string; decision: string; decision_budget_id: string | null } {
    return { outcome: this.outcome, decision: this.decision, decision_budget_id: this.budgetId };
  }

  /** The decision as the sidecar's JSON (`spendbus check`); hold_id is always null here. */
  toJSON(counters = true): Record<string, unknown> {
    const answer = this.response;
    const refusing = this.outcome === "refused" ? this.refusingRows() : [];
    const out: Record<string, unknown> = {
      allowed: this.allowed,
      decision: this.decision,
      outcome: this.outcome,
      status: answer.status,
      budget_id: this.budgetId,
      reason: this.reason,
      retry_after: answer.retryAfter,
      headers: answer.headers.map((h) => [...h]),
      body: answer.body,
      hold_id: this.holdId,
      over_budget: refusing.length > 0,
      job_over_budget: refusing.some((r) => r.plan.budget.scope === "session"),
      exceeded_budgets: [...new Set(refusing.map((r) => r.budgetId))],
      usage_fields: this.usageFields(),
    };
    if (counters) out.counters = this.counters.map((c) => c.toJSON());
    return out;
  }
}

/** The plans that can apply to an org, in the Python enforcer's order (enforcer/plans.py Index). */
class Index {
  readonly general: Plan[] = [];
  readonly byOrg = new Map<string, Plan[]>();

  constructor(budgets: Map<string, Budget>, unpricedDefault: string) {
    for (const budgetId of [...budgets.keys()].sort(compareCodePoints)) {
      const plan = planOf(budgets.get(budgetId)!, unpricedDefault);
      const orgs = plan.budget.match.get("org_id");
      if (orgs !== undefined && orgs.size > 0) {
        for (const org of orgs) {
          if (!this.byOrg.has(org)) this.byOrg.set(org, []);
          this.byOrg.get(org)!.push(plan);
        }
      } else {
        this.general.push(plan);
      }
    }
  }

  plans(ctx: Context): Plan[] {
    const pinned = this.byOrg.get(ctx.org);
    return pinned === undefined ? this.general : [...this.general, ...pinned];
  }
}

/** Python sorts str by code point; JS's default sort compares UTF-16 units. */
function compareCodePoints(a: string, b: string): number {
  const x = Array.from(a);
  const y = Array.from(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0)! - y[i].codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

const SCOPE_ATTRIBUTE: Record<string, string> = {
  secret: "secret_id",
  project: "project_id",
  grant: "grant_id",
  group: "group",
  user: "user_id",
};

function matches(plan: Plan, ctx: Context): boolean {
  for (const [attribute, allowed] of plan.budget.match) {
    if (!(ctx.canon.get(attribute) ?? []).some((v) => allowed.has(v))) return false;
  }
  return true;
}

/** The scope values of every counter of `plan` that `ctx` counts in (Plan.scoped). */
function scoped(plan: Plan, ctx: Context): string[][] {
  const scope = plan.budget.scope;
  if (scope === "org") return [[ctx.org]];
  if (scope === "session") {
    const sessions = ctx.canon.get("session_id")!;
    if (sessions.length === 0) return [];
    const identity = ctx.canon.get("user_id")!.length > 0 ? ctx.canon.get("user_id")! : ctx.canon.get("secret_id")!;
    return [[ctx.org, identity[0], sessions[0]]];
  }
  const values = ctx.canon.get(SCOPE_ATTRIBUTE[scope] ?? scope) ?? [];
  return values.map((v) => [ctx.org, v]);
}

/** A check's running state (enforcer/tally.py). */
class Tally {
  readonly rows: CounterStatus[] = [];
  refusal = -1;
  refusalEnd = 0;
  hard = false;
  estInput = 0;
  estOutput = 0;
  estTokens = -1;
  estNanos = -1;
  /** rows of counters whose budget has rate limits (null: none) */
  rated: number[] | null = null;
  /** the (counter, period) an admitted request holds its worst case on */
  readonly toHold: [string, string][] = [];

  constructor(
    readonly ctx: Context,
    readonly nowUs: number,
    readonly share: number,
    /** hold the estimate, take the rate and count the session (false: a peek) */
    readonly reserve: boolean,
  ) {}

  estimateTokens(defaultOutput: number): void {
    [this.estInput, this.estOutput] = requestTokens(this.ctx, defaultOutput);
    this.estTokens = this.estInput + this.estOutput;
  }

  considerRefusal(state: number, endUs: number | null): void {
    const isHard = state === EXCEEDED || state === TOO_LARGE || state === UNPRICED || state === SESSIONS;
    const end = endUs === null ? NEVER_US : endUs;
    if (this.refusal < 0 || (isHard && !this.hard) || (isHard === this.hard && end > this.refusalEnd)) {
      this.refusal = this.rows.length;
      this.refusalEnd = end;
      this.hard = isHard;
    }
  }
}

/** (input estimate, max output) of the request, in tokens (enforcer/estimates.py). */
export function requestTokens(ctx: Context, defaultOutput: number): [number, number] {
  const r = ctx.request;
  let input = 0;
  if (r.input_tokens !== null && r.input_tokens !== undefined) input = r.input_tokens;
  else if (r.request_bytes) input = Math.min(MAX_TOKENS_PER_EVENT, Math.ceil(r.request_bytes / REQUEST_BYTES_PER_TOKEN));
  let output = r.max_output_tokens ?? defaultOutput;
  const candidates = r.candidates;
  if (candidates !== null && candidates !== undefined && candidates > 1) {
    output = Math.min(MAX_TOKENS_PER_EVENT, output * candidates);
  }
  return [input, output];
}

/** Decides requests from a FollowerState as the Python enforcer's Checker does. */
export class Checker {
  readonly config: CheckConfig;
  private index: Index | null = null;
  private indexVersion = -1;
  readonly sessions: SessionBound;
  readonly buckets = new RateBuckets();
  readonly holds: Holds;
  private expiredAtUs = 0;

  constructor(
    readonly state: FollowerState,
    config: Partial<CheckConfig> = {},
  ) {
    this.config = { ...DEFAULT_CHECK_CONFIG, ...config };
    this.sessions = new SessionBound(this.config.maxSessionsPerKey);
    this.holds = new Holds(this.config.holdTimeoutS * 1_000_000);
    state.onVerdict((counter, period, asOfUs, seq) => this.holds.onVerdict(counter, period, asOfUs, seq));
    if (!Number.isInteger(this.config.replicas) || this.config.replicas < 1) {
      throw new RangeError(`replicas must be an integer >= 1, got ${this.config.replicas}`);
    }
  }

  private plansOf(ctx: Context): Plan[] {
    if (this.index === null || this.indexVersion !== this.state.policyVersion) {
      this.index = new Index(this.state.budgets, this.config.unpricedModels);
      this.indexVersion = this.state.policyVersion;
    }
    return this.index.plans(ctx);
  }

  /** Decide for one request (a context object, validated here: InvalidContext names a bad
   * field). An allowed request holds its worst case (`decision.holdId`) until `settle` or
   * `release` (or the hold timeout), and takes its rate. */
  check(request: RequestContext | Context): Decision {
    return this.decide(request, true);
  }

  /** The decision check would take, holding, taking and counting nothing. */
  peek(request: RequestContext | Context): Decision {
    return this.decide(request, false);
  }

  private decide(request: RequestContext | Context, reserve: boolean): Decision {
    const ctx = request instanceof Context ? request : new Context(request);
    const nowUs = this.state.clockUs();
    if (nowUs - this.expiredAtUs >= 1_000_000 || nowUs < this.expiredAtUs) {
      this.holds.expire(nowUs); // holds only over-count for a bounded time
      this.expiredAtUs = nowUs;
    }
    const freshAt = this.state.freshAtUs;
    if (this.state.ready && freshAt !== null && nowUs - freshAt <= this.config.graceS * 1_000_000) {
      return this.evaluate(ctx, nowUs, reserve);
    }
    return this.stale(ctx, nowUs, reserve);
  }

  private evaluate(ctx: Context, nowUs: number, reserve: boolean): Decision {
    const tally = new Tally(ctx, nowUs, this.config.replicas, reserve);
    for (const plan of this.plansOf(ctx)) {
      if (plan.budget.match.size > 0 && !matches(plan, ctx)) continue;
      const counters = scoped(plan, ctx);
      if (counters.length === 0) continue;
      const period = periodKey(plan.budget.window, nowUs);
      const endUs = periodEndUs(plan.budget.window, nowUs);
      for (const values of counters) this.count(tally, plan, values, period, endUs);
    }
    if (tally.refusal >= 0) return this.refused(tally);
    return this.admit(tally);
  }

  /** No budget refuses: a rate limit may (throttled), else the request takes its rate. */
  private admit(tally: Tally): Decision {
    const rated = tally.rated;
    const decision = (charges: Charges | null): Decision => {
      const allowed = new Decision(tally.ctx, "allowed", "allowed", tally.rows, -1, tally.nowUs, this.config);
      if (tally.reserve && (tally.toHold.length > 0 || (charges !== null && charges.length > 0))) {
        allowed.holdId = this.holds.reserve(tally.toHold, Math.max(tally.estNanos, 0), tally.estTokens, 1, tally.nowUs);
        allowed.charges = charges;
      }
      return allowed;
    };
    if (rated === null) return decision(null);
    if (tally.estTokens < 0) tally.estimateTokens(this.config.defaultMaxOutputTokens);
    const share = tally.share;
    let worst = -1;
    let worstWait = 0;
    let worstSpec: [boolean, number, number] = [false, 0, 0];
    const taken: [number, number][] = [];
    for (const i of rated) {
      const row = tally.rows[i];
      row.plan.budget.rates.forEach((spec, index) => {
        const bucket = this.buckets.bucketFor(row.counter, index, spec, share, tally.nowUs);
        bucket.refill(tally.nowUs, share);
        const wait = bucket.waitUs(share);
        if (wait > worstWait) [worst, worstWait, worstSpec] = [i, wait, spec];
        taken.push([i, index]);
      });
    }
    if (worst >= 0) {
      const row = tally.rows[worst];
      row.stateIndex = THROTTLED;
      const throttled = new Decision(tally.ctx, "throttled", "refused", tally.rows, worst, tally.nowUs, this.config);
      throttled.throttle = [worstSpec[0], worstSpec[1], worstSpec[2], worstWait];
      throttled.replicas = share;
      throttled.requestTokens = tally.estTokens;
      return throttled;
    }
    if (!tally.reserve) return decision(null);
    const charges: Charges = [];
    for (const [i, index] of taken) {
      const row = tally.rows[i];
      const bucket = this.buckets.bucketFor(row.counter, index, row.plan.budget.rates[index], share, tally.nowUs);
      if (bucket.tokens) {
        bucket.level -= tally.estTokens;
        if (tally.estTokens > bucket.largest) bucket.largest = tally.estTokens;
        charges.push([bucket, tally.estTokens]);
      } else {
        bucket.level -= 1.0;
        charges.push([bucket, 1]);
      }
    }
    return decision(charges);
  }

  /** The usage event of an admitted request was published (Checker.settle): its hold
   * becomes its actual cost, priced as the aggregator prices it, until a verdict covers it,
   * and its rate buckets get back the tokens its worst case took beyond those it used.
   * False when the hold is gone (released, expired). */
  settle(decision: Decision, event: UsageEvent): boolean {
    const holdId = decision.holdId;
    if (holdId === null || !this.holds.has(holdId)) return false;
    const tokens = {
      input: event.input_tokens,
      cacheRead: event.cache_read_tokens,
      cacheWrite: event.cache_write_tokens,
      cacheWrite1h: event.cache_write_1h_tokens,
      output: event.output_tokens,
    };
    const units = new Map(Object.entries(event.units ?? {}));
    const nanos = this.state.prices.priceNanos(event.model, event.occurred_at, tokens, units, event.service_tier);
    const billed = tokens.input + tokens.cacheRead + tokens.cacheWrite + tokens.output;
    if (decision.charges !== null) refund(decision.charges, billed, true);
    decision.charges = null;
    if (this.holds.countersOf(holdId).length === 0) return this.holds.release(holdId); // rates only
    const seqs = new Map<string, number>();
    for (const totals of this.holds.countersOf(holdId)) {
      const verdict = this.state.verdicts.get(totals.counter);
      if (verdict !== undefined) seqs.set(totals.key, verdict.seq);
    }
    const counts = event.outcome === "allowed" || event.outcome === "failed_open";
    return this.holds.settle(holdId, nanos, billed, counts ? 1 : 0, event.occurred_at, this.state.clockUs(), seqs);
  }

  /** The admitted request never reached the provider: its hold is dropped, its rate given back. */
  release(decision: Decision): boolean {
    if (decision.charges !== null) refund(decision.charges, 0, false);
    decision.charges = null;
    return decision.holdId !== null && this.holds.release(decision.holdId);
  }

  private count(tally: Tally, plan: Plan, values: string[], period: string, periodEnd: number | null): void {
    let endUs = periodEnd;
    const budget = plan.budget;
    const cid = compose([budget.budgetId, ...values]);
    let verdict = this.state.verdicts.get(cid) ?? null;
    let counted: CounterVerdict | null = null;
    if (verdict !== null && verdict.period === period) {
      counted = verdict;
    } else if (this.state.ahead.size > 0) {
      const promoted = this.state.promote(cid, period);
      if (promoted !== null) verdict = counted = promoted;
    }
    const [spentNanos, spentTokens, spentRequests] = counted === null ? [0, 0, 0] : spentAt(counted, tally.nowUs);
    const granted = this.state.raises.byBudget.has(budget.budgetId)
      ? this.state.raises.active(budget.budgetId, values, tally.nowUs)
      : null;
    const row = new CounterStatus(plan, values, period, endUs, verdict, spentNanos, spentTokens, spentRequests, OK, granted);
    const { limitNanos, limitTokens, limitRequests } = row;
    let state: number;
    if (
      (limitNanos !== null && spentNanos >= limitNanos) ||
      (limitTokens !== null && spentTokens >= limitTokens) ||
      (limitRequests !== null && spentRequests >= limitRequests)
    ) {
      state = EXCEEDED;
    } else if (budget.scope === "session" && verdict === null && plan.enforce && !this.sessions.admits(tally.ctx, tally.nowUs, tally.reserve)) {
      // a session id new to the key past the key's bound: its own counter would be one
      // more for every id a client makes up, each escaping the session budget
      state = SESSIONS;
    } else {
      state = plan.holdable ? this.hold(tally, plan, row) : OK;
      if (state === OK && (spentNanos || spentTokens || spentRequests) && plan.alertMin !== null) {
        if (usedFractionOf(row, spentNanos, spentTokens, spentRequests) >= plan.alertMin) state = ALERT;
      }
    }
    if ((state === EXCEEDED || state === TOO_LARGE) && counted !== null && counted.rolling !== null) {
      // a rolling window never resets as a whole: it reopens when enough of its buckets
      // have left for this request to fit (null: waiting cannot help)
      row.endUs = this.reopensAt(tally, row, counted.rolling);
      endUs = row.endUs;
    }
    row.stateIndex = state;
    if (state >= EXCEEDED && plan.enforce) tally.considerRefusal(state, endUs);
    if (plan.enforce && budget.rates.length > 0) (tally.rated ??= []).push(tally.rows.length);
    tally.rows.push(row);
  }

  /** This process's holds on the counter (into `row`) and whether this request's worst
   * case fits beside them, times the replicas, in what the verdict leaves (Counting._hold):
   * OK (to be held), UNPRICED, TOO_LARGE (alone it does not fit) or IN_FLIGHT. */
  private hold(tally: Tally, plan: Plan, row: CounterStatus): number {
    const held = this.holds.held.size > 0 ? this.holds.held.get(counterPeriod(row.counter, row.period)) : undefined;
    if (held !== undefined) {
      row.heldNanos = held.nanos;
      row.heldTokens = held.tokens;
      row.heldRequests = held.requests;
    }
    this.estimate(tally, row.limitNanos !== null);
    const model = tally.ctx.request.model ?? "";
    if (tally.estNanos === 0 && plan.refuseUnpriced && this.state.prices.unpriced(model, tally.nowUs)) {
      return UNPRICED; // a cost that cannot be priced cannot be held against the limit
    }
    const share = tally.share;
    if (
      (row.limitNanos !== null && row.spentNanos + share * (row.heldNanos + tally.estNanos) > row.limitNanos) ||
      (row.limitTokens !== null && row.spentTokens + share * (row.heldTokens + tally.estTokens) > row.limitTokens) ||
      (row.limitRequests !== null && row.spentRequests + share * (row.heldRequests + 1) > row.limitRequests)
    ) {
      if (
        (row.limitNanos !== null && row.spentNanos + share * tally.estNanos > row.limitNanos) ||
        (row.limitTokens !== null && row.spentTokens + share * tally.estTokens > row.limitTokens) ||
        (row.limitRequests !== null && row.spentRequests + share > row.limitRequests)
      ) {
        return TOO_LARGE;
      }
      return IN_FLIGHT;
    }
    tally.toHold.push([row.counter, row.period]);
    return OK;
  }

  /** When enough of a rolling window's buckets have left for this request's worst case,
   * times the replicas, to fit, by this follower's clock; null when it never will. */
  private reopensAt(tally: Tally, row: CounterStatus, rolling: RollingSpend): number | null {
    this.estimate(tally, row.limitNanos !== null);
    const share = tally.share;
    const needs = [share * Math.max(tally.estNanos, 0), share * tally.estTokens, share];
    return rolling.fitsAt(tally.nowUs, [row.limitNanos, row.limitTokens, row.limitRequests], needs);
  }

  /** The request's worst case into `tally`, once: its tokens and, with `priced`, its cost. */
  private estimate(tally: Tally, priced: boolean): void {
    if (tally.estTokens < 0) tally.estimateTokens(this.config.defaultMaxOutputTokens);
    if (priced && tally.estNanos < 0) tally.estNanos = this.worstCase(tally, tally.estOutput);
  }

  private worstCase(tally: Tally, output: number): number {
    return this.state.prices.worstCaseNanos(tally.ctx.request.model ?? "", tally.nowUs, tally.estInput, output, tally.ctx.units);
  }

  private refused(tally: Tally): Decision {
    const rows = tally.rows;
    const refusing = rows[tally.refusal];
    const budget = refusing.plan.budget;
    const value = !tally.hard ? "in_flight_budget_exceeded" : budget.scope === "session" ? "job_budget_exceeded" : "budget_exceeded";
    const decision = new Decision(tally.ctx, value, "refused", rows, tally.refusal, tally.nowUs, this.config);
    const state = refusing.stateIndex;
    if (state !== EXCEEDED && state !== UNPRICED && state !== SESSIONS && tally.estTokens >= 0) {
      decision.requestNanos = Math.max(tally.estNanos, 0);
      decision.requestTokens = tally.estTokens;
      decision.replicas = tally.share;
      let fitting = this.fittingMaxTokens(tally);
      const candidates = tally.ctx.request.candidates;
      if (fitting !== null && candidates !== null && candidates !== undefined && candidates > 1) {
        fitting = Math.floor(fitting / candidates);
      }
      decision.fittingMaxTokens = fitting;
    }
    return decision;
  }

  /** The largest max output tokens every enforce counter would admit now (enforcer/fitting.py). */
  private fittingMaxTokens(tally: Tally): number | null {
    const fits = (output: number): boolean => {
      let nanos = -1;
      for (const row of tally.rows) {
        if (!row.plan.holdable) continue;
        if (row.stateIndex === EXCEEDED) return false;
        if (row.limitRequests !== null && row.spentRequests + tally.share * (row.heldRequests + 1) > row.limitRequests) {
          return false;
        }
        if (
          row.limitTokens !== null &&
          row.spentTokens + tally.share * (row.heldTokens + tally.estInput + output) > row.limitTokens
        ) {
          return false;
        }
        if (row.limitNanos !== null) {
          if (nanos < 0) nanos = this.worstCase(tally, output);
          if (row.spentNanos + tally.share * (row.heldNanos + nanos) > row.limitNanos) return false;
        }
      }
      return true;
    };
    if (!fits(0)) return null;
    const maxOutput = tally.estOutput;
    if (maxOutput <= 1) return 0;
    const base = this.worstCase(tally, 0);
    const top = this.worstCase(tally, maxOutput);
    // floats, as Python's true division: the guess is checked and moved by single tokens
    const slope = (top - base) / maxOutput;
    let guess = maxOutput - 1;
    for (const row of tally.rows) {
      if (!row.plan.holdable) continue;
      if (row.limitTokens !== null) {
        const room = Math.floor((row.limitTokens - row.spentTokens) / tally.share) - row.heldTokens - tally.estInput;
        guess = Math.min(guess, room);
      }
      if (row.limitNanos !== null && slope > 0) {
        const roomNanos = (row.limitNanos - row.spentNanos) / tally.share - row.heldNanos - base;
        guess = Math.min(guess, Math.trunc(roomNanos / slope));
      }
    }
    guess = Math.max(0, guess);
    let low: number;
    let high: number;
    if (fits(guess)) {
      if (!fits(guess + 1)) return guess;
      low = guess + 1;
      high = maxOutput;
    } else {
      if (guess === 0 || fits(guess - 1)) return Math.max(0, guess - 1);
      low = 0;
      high = guess - 1;
    }
    while (high - low > 1) {
      const middle = Math.floor((low + high) / 2);
      if (fits(middle)) low = middle;
      else high = middle;
    }
    return low;
  }

  /** Verdicts not loaded or stale: fail_mode decides requests an enforce budget covers. */
  private stale(ctx: Context, nowUs: number, reserve: boolean): Decision {
    const state = this.state;
    // only called when the verdicts cannot be trusted: not loaded, or not fresh within grace
    const reason = state.ready ? "stale" : "not_ready";
    const hits: [Plan, string[]][] = [];
    for (const plan of this.plansOf(ctx)) {
      if (plan.budget.match.size > 0 && !matches(plan, ctx)) continue;
      for (const values of scoped(plan, ctx)) hits.push([plan, values]);
    }
    if (reason !== "not_ready" && !hits.some(([plan]) => plan.enforce)) {
      return this.evaluate(ctx, nowUs, reserve); // warn budgets never block
    }
    const closed = this.config.failMode === "closed";
    const failed = closed ? FAILED_CLOSED : FAILED_OPEN;
    const rows: CounterStatus[] = [];
    let first = -1;
    for (const [plan, values] of hits) {
      const period = periodKey(plan.budget.window, nowUs);
      const endUs = periodEndUs(plan.budget.window, nowUs);
      if (first < 0 && plan.enforce) first = rows.length;
      const granted = state.raises.active(plan.budget.budgetId, values, nowUs);
      rows.push(new CounterStatus(plan, values, period, endUs, null, 0, 0, 0, failed, granted));
    }
    if (closed) return new Decision(ctx, "failed_closed", "failed_closed", rows, first, nowUs, this.config, reason);
    return new Decision(ctx, "failed_open", "failed_open", rows, -1, nowUs, this.config, reason);
  }
}
