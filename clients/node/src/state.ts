/**
 * What a follower holds in memory (enforcer/state.py): the budgets of budget.policies,
 * the raises of budget.raises, and one verdict per counter of budget.verdicts, kept by
 * the period rule of docs/contract.md ("Following the verdicts").
 */
import { ContractViolation } from "./avro";
import { compose, decompose } from "./ids";
import { parseWindow, periodEndUs, periodKey, Window } from "./periods";
import { PriceBook } from "./pricing";
import { RaiseBook } from "./raises";
import { RateSpec, rateSpecs } from "./rates";
import { RollingSpend, rollingSpend } from "./rolling";

/** One budget, as its BudgetPolicy record says (schemas/budgets.py Budget.from_record). */
export interface Budget {
  budgetId: string;
  scope: string;
  window: Window;
  action: "enforce" | "warn";
  match: Map<string, Set<string>>;
  limitNanos: number | null;
  limitTokens: number | null;
  limitRequests: number | null;
  alertAt: number[];
  /** the budget's rate limits: [tokens?, count, window µs] each */
  rates: RateSpec[];
  unpriced: string | null;
}

export function budgetFromRecord(record: Record<string, unknown>): Budget {
  const match = new Map<string, Set<string>>();
  for (const [attribute, joined] of Object.entries(record.match as Record<string, string>)) {
    // a list-valued match travels as one string joined by the unit separator
    match.set(attribute, new Set(joined.split("\x1f")));
  }
  const rate = record.rate as Record<string, number | null> | null | undefined;
  return {
    budgetId: record.budget_id as string,
    scope: record.scope as string,
    window: parseWindow(
      record.window as string,
      (record.timezone as string | undefined) ?? "UTC",
      (record.week_start as string | undefined) ?? "monday",
      (record.month_start_day as number | undefined) ?? 1,
    ),
    action: record.action as "enforce" | "warn",
    match,
    limitNanos: record.limit_nanos as number | null,
    limitTokens: record.limit_tokens as number | null,
    limitRequests: record.limit_requests as number | null,
    alertAt: record.alert_at as number[],
    rates: rateSpecs(rate),
    unpriced: (record.unpriced as string | null | undefined) ?? null,
  };
}

/** The last verdict held for one counter (times in µs). */
export interface CounterVerdict {
  counterKey: string;
  budgetId: string;
  period: string;
  spentNanos: number;
  spentTokens: number;
  spentRequests: number;
  asOfUs: number;
  seq: number;
  emittedAtUs: number;
  /** a rolling window's spend as its buckets leave the window (null for other windows) */
  rolling: RollingSpend | null;
  /** when the first of its buckets leaves (Infinity: none will) */
  firstLeavesUs: number;
}

/** [nanos, tokens, requests] the verdict counts at `nowUs` (rolling buckets that left dropped). */
export function spentAt(verdict: CounterVerdict, nowUs: number): [number, number, number] {
  if (verdict.rolling === null || nowUs < verdict.firstLeavesUs) {
    return [verdict.spentNanos, verdict.spentTokens, verdict.spentRequests];
  }
  return verdict.rolling.at(nowUs);
}

function verdictFromRecord(record: Record<string, unknown>): CounterVerdict {
  const rolling = rollingSpend(record);
  return {
    rolling,
    firstLeavesUs: rolling?.firstLeavesAtUs ?? Infinity,
    counterKey: record.counter_key as string,
    budgetId: record.budget_id as string,
    period: record.period as string,
    spentNanos: record.spent_nanos as number,
    spentTokens: record.spent_tokens as number,
    spentRequests: record.spent_requests as number,
    asOfUs: record.as_of as number,
    seq: record.seq as number,
    emittedAtUs: record.emitted_at as number,
  };
}

/** Both calendar periods of one kind and `candidate` first (enforcer.state.period_is_older). */
export function periodIsOlder(candidate: string, held: string): boolean {
  return (
    candidate.length > 2 &&
    held.length > 2 &&
    candidate[0] === held[0] &&
    "dwm".includes(candidate[0]) &&
    candidate < held
  );
}

/** Called with (counter key, period, as_of µs, seq) for every verdict applied. */
export type VerdictListener = (counter: string, period: string, asOfUs: number, seq: number) => void;

/** µs since the epoch, the follower's clock (injectable for tests). */
export type ClockUs = () => number;

export const systemClockUs: ClockUs = () => Date.now() * 1000;

export class FollowerState {
  readonly budgets = new Map<string, Budget>();
  policyVersion = 0;
  /** the price versions of the pricing topic */
  readonly prices = new PriceBook();
  /** the temporary raises of budget limits (budget.raises) */
  readonly raises = new RaiseBook();
  /** counter key -> its last verdict */
  readonly verdicts = new Map<string, CounterVerdict>();
  /** counter key -> a verdict of a period our clock has not reached yet */
  readonly ahead = new Map<string, CounterVerdict>();
  /** caught up with the end offsets seen at start */
  ready = false;
  /** when (µs, our clock) the verdict stream was last confirmed caught up */
  freshAtUs: number | null = null;
  verdictsApplied = 0;
  verdictsIgnored = 0;
  private readonly listeners: VerdictListener[] = [];

  constructor(readonly clockUs: ClockUs = systemClockUs) {}

  applyPolicy(budgetId: string, record: Record<string, unknown> | null): void {
    if (record === null) {
      if (this.budgets.delete(budgetId)) this.policyVersion++;
      return;
    }
    this.budgets.set(budgetId, budgetFromRecord(record));
    this.policyVersion++;
  }

  /** Add, replace or remove (null) one price version. */
  applyPrice(version: string, record: Record<string, unknown> | null): void {
    this.prices.apply(version, record);
  }

  /** Add, replace (a revocation) or remove (null) one raise. */
  applyRaise(raiseId: string, record: Record<string, unknown> | null): void {
    this.raises.apply(raiseId, record);
  }

  /** Call `listener` for every verdict applied (the checker's holds: what a verdict covers). */
  onVerdict(listener: VerdictListener): void {
    this.listeners.push(listener);
  }

  private applied(cid: string, verdict: CounterVerdict): void {
    this.verdictsApplied++;
    for (const listener of this.listeners) listener(cid, verdict.period, verdict.asOfUs, verdict.seq);
  }

  /** Apply one verdict (`key`: the message key); false when ignored (lower seq, older period). */
  applyVerdict(key: string, record: Record<string, unknown> | null): boolean {
    const parts = decompose(key);
    if (parts.length === 0) throw new ContractViolation("bad_key", `empty counter key ${JSON.stringify(key)}`);
    const cid = compose(parts);
    if (record === null) {
      this.ahead.delete(cid);
      return this.verdicts.delete(cid);
    }
    const verdict = verdictFromRecord(record);
    const held = this.verdicts.get(cid);
    if (held !== undefined && verdict.period !== held.period) {
      const current = this.currentPeriod(verdict.budgetId);
      if (current === null || (verdict.period !== current && held.period !== current)) {
        // neither is enforced now: the newer period wins
        if (periodIsOlder(verdict.period, held.period)) {
          this.verdictsIgnored++;
          return false;
        }
      } else if (verdict.period === current) {
        if (periodIsOlder(current, held.period)) this.keepAhead(cid, held);
      } else {
        // the held verdict is the current period's: nothing else replaces it
        if (!periodIsOlder(current, verdict.period) || !this.keepAhead(cid, verdict)) {
          this.verdictsIgnored++;
          return false;
        }
        this.applied(cid, verdict);
        return true;
      }
    } else if (held !== undefined && verdict.seq < held.seq) {
      this.verdictsIgnored++;
      return false;
    }
    this.verdicts.set(cid, verdict);
    this.applied(cid, verdict);
    return true;
  }

  /** The verdict kept ahead for `cid`, once `period` (current now) is its period. */
  promote(cid: string, period: string): CounterVerdict | null {
    const verdict = this.ahead.get(cid);
    if (verdict === undefined || verdict.period !== period) return null;
    this.ahead.delete(cid);
    this.verdicts.set(cid, verdict);
    return verdict;
  }

  private keepAhead(cid: string, verdict: CounterVerdict): boolean {
    const kept = this.ahead.get(cid);
    if (
      kept !== undefined &&
      (periodIsOlder(verdict.period, kept.period) || (verdict.period === kept.period && verdict.seq < kept.seq))
    ) {
      return false;
    }
    this.ahead.set(cid, verdict);
    return true;
  }

  private currentPeriod(budgetId: string): string | null {
    const budget = this.budgets.get(budgetId);
    return budget === undefined ? null : periodKey(budget.window, this.clockUs());
  }

  /** The period of `budget` at `nowUs` and when it ends. */
  static periodOf(budget: Budget, nowUs: number): [string, number | null] {
    return [periodKey(budget.window, nowUs), periodEndUs(budget.window, nowUs)];
  }
}
