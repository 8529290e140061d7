/**
 * What a refused (or warned) request is answered with (enforcer/refusals.py and
 * enforcer/response.py): the same status, headers and JSON body, per refusal style.
 */
import type { CounterStatus, Decision } from "./check";
import type { Budget } from "./state";
import { DAY_US, isoUs } from "./periods";
import { raiseJSON } from "./raises";

export interface Response {
  status: number;
  headers: [string, string][];
  body: Record<string, unknown> | null;
  retryAfter: number | null;
}

export const SPEND_HEADER = "X-Spend-Budget";
const RETRY_AFTER = "Retry-After";
const SHOULD_RETRY = "x-should-retry";
const REFUSAL_HEADER = "X-Spend-Refusal";
const JSON_TYPE: [string, string] = ["Content-Type", "application/json"];
const NANOS_PER_CENT = 10_000_000;

export const NATIVE_DIALECTS: Record<string, string> = {
  anthropic: "anthropic",
  openai: "openai",
  azure: "openai",
  azure_openai: "openai",
  "azure-openai": "openai",
  openai_compatible: "openai",
  gemini: "gemini",
  google: "gemini",
  google_ai: "gemini",
  vertex: "gemini",
  vertex_ai: "gemini",
  bedrock: "bedrock",
  aws_bedrock: "bedrock",
  "aws-bedrock": "bedrock",
};

// urllib.parse.quote's always-safe characters, and the header's own (enforcer/response.py)
const HEADER_SAFE = new Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~!#$%&'*+-.^_`|~:@/()[]{}<>?=");

/** A value safe inside a header parameter (no CR/LF, no `;` or `,`), as urllib's quote writes it. */
export function headerText(value: string): string {
  let out = "";
  for (const ch of value) {
    if (HEADER_SAFE.has(ch)) {
      out += ch;
    } else {
      for (const byte of Buffer.from(ch, "utf8")) out += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
    }
  }
  return out;
}

/** format_usd(nanos, 6): `$` and the dollars to 6 places, half to even. */
export function formatUsd6(nanos: number): string {
  const n = BigInt(nanos);
  const negative = n < 0n;
  const abs = negative ? -n : n;
  let micros = abs / 1000n;
  const rest = abs % 1000n;
  if (rest > 500n || (rest === 500n && micros % 2n === 1n)) micros += 1n;
  const dollars = micros / 1_000_000n;
  const fraction = (micros % 1_000_000n).toString().padStart(6, "0");
  return `$${negative && micros !== 0n ? "-" : ""}${dollars}.${fraction}`;
}

/** The X-Spend-Budget header of one counter. */
export function spendHeaderOf(budget: Budget, state: string, endUs: number | null, usedFraction: number): [string, string] {
  const shown = state === "exceeded" || state === "in_flight" ? "exceeded" : state;
  const reset = isoUs(endUs) ?? (budget.window.kind === "rolling" ? "rolling" : "never");
  const used = Math.trunc(usedFraction * 100);
  return [
    SPEND_HEADER,
    `${headerText(budget.budgetId)}; scope=${headerText(budget.scope)}; used=${used}%; state=${shown}; reset=${reset}`,
  ];
}

function secondsUntil(endUs: number, nowUs: number): number {
  return Math.max(1, Math.ceil((endUs - nowUs) / 1_000_000));
}

function dialect(provider: string | null | undefined): string | null {
  if (provider === null || provider === undefined) return null;
  return NATIVE_DIALECTS[provider.trim().toLowerCase()] ?? null;
}

/** repr() of a Python str, as the refusal messages quote budget ids. */
export function pyRepr(value: string): string {
  const quote = value.includes("'") && !value.includes('"') ? '"' : "'";
  let out = "";
  for (const ch of value) {
    const code = ch.codePointAt(0)!;
    if (ch === "\\") out += "\\\\";
    else if (ch === quote) out += `\\${quote}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return `${quote}${out}${quote}`;
}

export function respond(decision: Decision): Response {
  const config = decision.config;
  if (decision.allowed) {
    return { status: 200, headers: decision.warningHeaders(), body: null, retryAfter: null };
  }
  let style = config.refusalStyle === "native" ? dialect(decision.ctx.request.provider) : null;
  if (decision.decision === "failed_closed") return failedClosed(decision, style);
  const refusing = decision.refusing!;
  if (decision.decision === "throttled") return throttled(decision, refusing, style);
  if (config.refusalStyle === "seed000") style = "seed000";
  const value = decision.decision;
  const reason = REASONS[refusing.state];
  if (reason === undefined) throw new Error(`no refusal for a counter in state ${refusing.state}`);
  const budget = pyRepr(refusing.budgetId);
  let retryAfter: number | null;
  let message: string;
  if (reason === "too_many_sessions") {
    // a session the key already opened passes; a new id only once the day turns (UTC)
    retryAfter = secondsUntil((Math.floor(decision.nowUs / DAY_US) + 1) * DAY_US, decision.nowUs);
    message =
      `Budget ${budget}: key ${pyRepr(decision.ctx.request.secret_id)} opened ` +
      `${config.maxSessionsPerKey} sessions today (UTC), the most it may ` +
      `(max_sessions_per_key); session ${pyRepr(decision.ctx.request.session_id ?? "")} is new and is ` +
      "refused until the day ends: reuse a session id.";
  } else if (reason === "in_flight") {
    // the holds of requests in flight keep this one out: they settle within seconds, so a
    // retry soon may pass
    retryAfter = config.inFlightRetryAfterS;
    message = `Budget ${budget}: the requests in flight could use what is left; retry when they finish.${fitText(decision)}`;
  } else if (reason === "model_unpriced") {
    // no price to hold or count: retrying cannot help until a price is applied
    retryAfter = null;
    message =
      `Budget ${budget} has a USD limit and refuses model ${pyRepr(decision.ctx.request.model ?? "")}: ` +
      "no price in force prices it, so its cost could not be counted against the " +
      "limit (apply a price for it, a price-table fallback, or unpriced: allow_free).";
  } else {
    retryAfter = refusing.endUs !== null ? secondsUntil(refusing.endUs, decision.nowUs) : null;
    const reset = isoUs(refusing.endUs);
    const until = reset ? ` until ${reset}.` : ".";
    message =
      reason === "exhausted"
        ? `Budget ${budget} is exhausted${until}`
        : `Budget ${budget}: this request's worst case (${formatUsd6(decision.requestNanos)}, ${decision.requestTokens} tokens) ` +
          `does not fit what is left (${leftText(decision, refusing)}).${fitText(decision)} A retry of this request is refused${until}`;
  }
  const headers: [string, string][] = [JSON_TYPE];
  if (retryAfter !== null) headers.push([RETRY_AFTER, String(retryAfter)]);
  headers.push([SHOULD_RETRY, reason === "in_flight" ? "true" : "false"]);
  if (refusing.state === "exceeded") {
    headers.push(spendHeaderOf(refusing.plan.budget, refusing.state, refusing.endUs, refusing.usedFraction()));
  }
  const session = refusing.plan.budget.scope === "session";
  if (style === null) {
    const status = value === "job_budget_exceeded" || session ? 429 : 402;
    const body = defaultBody(value, refusing);
    body.reason = reason;
    if (reason === "model_unpriced") body.model = decision.ctx.request.model ?? null;
    else if (reason === "too_many_sessions") {
      body.session_id = decision.ctx.request.session_id ?? null;
      body.max_sessions_per_key = config.maxSessionsPerKey;
    }
    else if (reason !== "exhausted") Object.assign(body, leftFields(decision, refusing));
    body.message = message;
    return { status, headers, body, retryAfter };
  }
  if (style === "seed000") {
    const limit = refusing.limitNanos;
    const spent = refusing.spentNanos;
    const body = {
      error: "budget_exceeded",
      secretId: decision.ctx.request.secret_id,
      period: refusing.period,
      limitCents: limit === null ? null : Math.floor(limit / NANOS_PER_CENT),
      spentCents: limit === null ? null : Math.ceil(spent / NANOS_PER_CENT),
    };
    return { status: 402, headers: [...headers, [REFUSAL_HEADER, headerText(message)]], body, retryAfter };
  }
  if (reason === "model_unpriced") return invalid(style, message, headers);
  return native(style, 429, message, headers, retryAfter, true);
}

/** Why a budget refused, by the refusing counter's state (the body's `reason`). */
const REASONS: Record<string, string> = {
  exceeded: "exhausted",
  too_large: "request_too_large",
  in_flight: "in_flight",
  unpriced: "model_unpriced",
  too_many_sessions: "too_many_sessions",
};

/** A request the enforcer will never admit as it is: each SDK's bad-request error (400). */
function invalid(style: string, message: string, headers: [string, string][]): Response {
  let body: Record<string, unknown>;
  if (style === "anthropic") {
    body = { type: "error", error: { type: "invalid_request_error", message } };
  } else if (style === "openai") {
    body = { error: { message, type: "invalid_request_error", param: "model", code: "model_unpriced" } };
  } else if (style === "gemini") {
    body = { error: { code: 400, message, status: "INVALID_ARGUMENT" } };
  } else {
    headers = [...headers, ["x-amzn-ErrorType", "ValidationException"]];
    body = { message };
  }
  return { status: 400, headers, body, retryAfter: null };
}

/** 429 `throttled`: this replica's share of the budget's rate is used up for now; Retry-After
 * (and `retry-after-ms`) is when its bucket admits again, and a retry is welcome. */
function throttled(decision: Decision, refusing: CounterStatus, style: string | null): Response {
  const [tokens, count, windowUs, waitUs] = decision.throttle!;
  const unit = tokens ? "tokens" : "requests";
  const window = windowUs === 1_000_000 ? "second" : "minute";
  const retryAfter = Math.max(1, Math.ceil(waitUs / 1_000_000));
  const retryMs = Math.max(1, Math.ceil(waitUs / 1000));
  const share = decision.replicas;
  const message =
    `Budget ${pyRepr(refusing.budgetId)}: rate limit of ${count} ${unit} per ${window} reached` +
    (share > 1 ? ` (this replica's 1/${share} share)` : "") +
    `; retry in ${retryMs} ms.`;
  const headers: [string, string][] = [
    JSON_TYPE,
    [RETRY_AFTER, String(retryAfter)],
    ["retry-after-ms", String(retryMs)],
    [SHOULD_RETRY, "true"],
  ];
  if (style === null || style === "seed000") {
    const body = {
      error: "throttled",
      budget_id: refusing.budgetId,
      counter: refusing.counter,
      limit: { unit, count, per: window },
      replicas: share,
      retry_after_ms: retryMs,
      message,
    };
    return { status: 429, headers, body, retryAfter };
  }
  if (style === "openai") {
    const body = { error: { message, type: unit, param: null, code: "rate_limit_exceeded" } };
    return { status: 429, headers, body, retryAfter };
  }
  return native(style, 429, message, headers, retryAfter, true);
}

function leftText(decision: Decision, refusing: CounterStatus): string {
  const share = decision.replicas;
  const parts: string[] = [];
  const limits: [number | null, number, number, string][] = [
    [refusing.limitNanos, refusing.spentNanos, refusing.heldNanos, "nanos"],
    [refusing.limitTokens, refusing.spentTokens, refusing.heldTokens, "tokens"],
    [refusing.limitRequests, refusing.spentRequests, refusing.heldRequests, "requests"],
  ];
  for (const [limit, spent, held, unit] of limits) {
    if (limit === null) continue;
    const left = Math.max(0, limit - spent - held);
    let text = unit === "nanos" ? formatUsd6(left) : `${left} ${unit}`;
    if (share > 1) {
      const mine = Math.max(0, Math.floor((limit - spent) / share) - held);
      const mineText = unit === "nanos" ? formatUsd6(mine) : `${mine} ${unit}`;
      text += `, ${mineText} of it this replica's 1/${share} share`;
    }
    parts.push(text);
  }
  return parts.join("; ");
}

function fitText(decision: Decision): string {
  if (decision.requestTokens < 0) return "";
  if (decision.fittingMaxTokens === null) return " Not even the input fits with max_tokens 0.";
  return ` The largest max_tokens that fits now is ${decision.fittingMaxTokens}.`;
}

function leftFields(decision: Decision, refusing: CounterStatus): Record<string, unknown> {
  const remaining = refusing.remaining();
  return {
    remaining_nanos: remaining.nanos,
    remaining_tokens: remaining.tokens,
    remaining_requests: remaining.requests,
    held_tokens: refusing.heldTokens,
    held_requests: refusing.heldRequests,
    request_nanos: decision.requestNanos,
    request_tokens: decision.requestTokens,
    replicas: decision.replicas,
    max_tokens_that_fits: decision.fittingMaxTokens,
  };
}

function defaultBody(value: string, refusing: CounterStatus): Record<string, unknown> {
  const budget = refusing.plan.budget;
  const body: Record<string, unknown> = {
    error: value,
    budget_id: refusing.budgetId,
    counter: refusing.counter,
    period: refusing.period,
    limit_nanos: refusing.limitNanos,
    spent_nanos: refusing.spentNanos,
    reset_at: isoUs(refusing.endUs),
    limit_tokens: refusing.limitTokens,
    spent_tokens: refusing.spentTokens,
    limit_requests: refusing.limitRequests,
    spent_requests: refusing.spentRequests,
    held_nanos: refusing.heldNanos,
  };
  if (refusing.granted !== null) {
    // a raised counter: its base limits and the raise, beside the limits checked
    body.base_limit_nanos = budget.limitNanos;
    body.base_limit_tokens = budget.limitTokens;
    body.base_limit_requests = budget.limitRequests;
    body.raise = raiseJSON(refusing.granted);
  }
  return body;
}

function failedClosed(decision: Decision, style: string | null): Response {
  const retryAfter = decision.config.failClosedRetryAfterS;
  const headers: [string, string][] = [JSON_TYPE, [RETRY_AFTER, String(retryAfter)]];
  const message =
    "Spend limits cannot be verified right now (budget verdicts are " +
    `${decision.reason === "not_ready" ? "not loaded" : "stale"}); retry later.`;
  if (style === null) {
    const body = { error: "failed_closed", reason: decision.reason, budget_id: decision.budgetId, message };
    return { status: 503, headers, body, retryAfter };
  }
  return native(style, 503, message, headers, retryAfter, false);
}

function native(
  style: string,
  status: number,
  message: string,
  headers: [string, string][],
  retryAfter: number | null,
  quota: boolean,
): Response {
  let body: Record<string, unknown>;
  if (style === "anthropic") {
    body = { type: "error", error: { type: quota ? "rate_limit_error" : "api_error", message } };
  } else if (style === "openai") {
    const kind = quota ? "insufficient_quota" : "server_error";
    body = { error: { message, type: kind, param: null, code: quota ? kind : null } };
  } else if (style === "gemini") {
    body = { error: { code: status, message, status: quota ? "RESOURCE_EXHAUSTED" : "UNAVAILABLE" } };
  } else {
    headers = [...headers, ["x-amzn-ErrorType", quota ? "ThrottlingException" : "ServiceUnavailableException"]];
    body = { message };
  }
  return { status, headers, body, retryAfter };
}
