/**
 * Temporary raises of budget limits (budget.raises; schemas/raises.py): the raise that
 * applies to a counter now — one of the counter itself, else one of every counter of the
 * budget, the latest started first — and the limits it gives.
 */
import { isoUs } from "./periods";

export interface BudgetRaise {
  raiseId: string;
  budgetId: string;
  /** the counter raised (org first); empty: every counter of the budget */
  scopeValues: string[];
  mode: "by" | "to";
  raiseNanos: number | null;
  raiseTokens: number | null;
  raiseRequests: number | null;
  startsAtUs: number;
  untilUs: number;
  reason: string;
  revokedAtUs: number | null;
}

function raiseFromRecord(record: Record<string, unknown>): BudgetRaise {
  return {
    raiseId: record.raise_id as string,
    budgetId: record.budget_id as string,
    scopeValues: record.scope_values as string[],
    mode: record.mode as "by" | "to",
    raiseNanos: record.raise_nanos as number | null,
    raiseTokens: record.raise_tokens as number | null,
    raiseRequests: record.raise_requests as number | null,
    startsAtUs: record.starts_at as number,
    untilUs: record.until as number,
    reason: record.reason as string,
    revokedAtUs: (record.revoked_at as number | null) ?? null,
  };
}

/** When the raise stops applying: `until`, or its revocation if earlier. */
export function endsAtUs(r: BudgetRaise): number {
  return r.revokedAtUs !== null && r.revokedAtUs < r.untilUs ? r.revokedAtUs : r.untilUs;
}

/** The effective [nanos, tokens, requests] limits over the base ones. */
export function raisedLimits(
  r: BudgetRaise,
  nanos: number | null,
  tokens: number | null,
  requests: number | null,
): [number | null, number | null, number | null] {
  const limit = (base: number | null, amount: number | null): number | null =>
    base === null || amount === null ? base : r.mode === "by" ? base + amount : amount;
  return [limit(nanos, r.raiseNanos), limit(tokens, r.raiseTokens), limit(requests, r.raiseRequests)];
}

/** What refusals and counters show of the raise. */
export function raiseJSON(r: BudgetRaise): Record<string, unknown> {
  return {
    raise_id: r.raiseId,
    mode: r.mode,
    raise_nanos: r.raiseNanos,
    raise_tokens: r.raiseTokens,
    raise_requests: r.raiseRequests,
    until: isoUs(endsAtUs(r)),
    reason: r.reason,
  };
}

function byCodePoint(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!);
  const y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

export class RaiseBook {
  private readonly byId = new Map<string, BudgetRaise>();
  /** budget id -> its raises, newest start first (the lookup's order) */
  readonly byBudget = new Map<string, BudgetRaise[]>();

  /** Add or replace (a revocation) one raise; null removes it. */
  apply(raiseId: string, record: Record<string, unknown> | null): void {
    const old = this.byId.get(raiseId);
    if (old !== undefined) {
      this.byId.delete(raiseId);
      const kept = this.byBudget.get(old.budgetId)!.filter((r) => r.raiseId !== raiseId);
      if (kept.length > 0) this.byBudget.set(old.budgetId, kept);
      else this.byBudget.delete(old.budgetId);
    }
    if (record === null) return;
    const raise = raiseFromRecord(record);
    this.byId.set(raiseId, raise);
    const raises = this.byBudget.get(raise.budgetId) ?? [];
    raises.push(raise);
    raises.sort((a, b) => b.startsAtUs - a.startsAtUs || byCodePoint(b.raiseId, a.raiseId));
    this.byBudget.set(raise.budgetId, raises);
  }

  /** The raise that applies to the counter at `atUs`, if any. */
  active(budgetId: string, scopeValues: string[], atUs: number): BudgetRaise | null {
    const raises = this.byBudget.get(budgetId);
    if (raises === undefined) return null;
    let wide: BudgetRaise | null = null;
    for (const r of raises) {
      if (!(r.startsAtUs <= atUs && atUs < endsAtUs(r))) continue;
      if (r.scopeValues.length === scopeValues.length && r.scopeValues.every((v, i) => v === scopeValues[i])) return r;
      if (r.scopeValues.length === 0 && wide === null) wide = r;
    }
    return wide;
  }
}
