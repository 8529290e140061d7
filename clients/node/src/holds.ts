/**
 * Reserve-and-settle (enforcer/holds.py): before forwarding, an admitted request holds its
 * worst case on every enforce counter it counts in, and checks add the holds to the verdict
 * spend, so requests in flight together cannot pass a budget. Per (counter, period):
 *
 *   reserve -> held (estimate) -settle(usage)-> held (actual cost)
 *      release / timeout -> dropped;   a verdict with as_of >= the event's time and a
 *                                      newer seq than when settled -> dropped there
 */

/** Running totals held on one (counter, period). */
export interface CounterHolds {
  key: string;
  counter: string;
  period: string;
  nanos: number;
  tokens: number;
  requests: number;
  holds: number;
  lastHold: number;
}

interface Hold {
  holdId: number;
  nanos: number;
  tokens: number;
  requests: number;
  expiresUs: number;
  /** the totals still holding this hold's amount, each once */
  counters: CounterHolds[];
  /** event time of the usage once settled (null while in flight) */
  occurredUs: number | null;
  /** parallel to counters: the seq of the verdict held when settled (-1: none) */
  seqs: number[];
}

/** The key of a (counter, period). */
export function counterPeriod(counter: string, period: string): string {
  return JSON.stringify([counter, period]);
}

export class Holds {
  /** (counter, period) -> totals (only those with outstanding holds) */
  readonly held = new Map<string, CounterHolds>();
  private readonly holds = new Map<number, Hold>();
  /** (counter, period) -> the settled holds on it (what a verdict may drop) */
  private readonly settled = new Map<string, Set<number>>();
  private nextId = 1;
  droppedByVerdict = 0;
  droppedByTimeout = 0;

  constructor(readonly timeoutUs: number) {}

  get size(): number {
    return this.holds.size;
  }

  has(holdId: number): boolean {
    return this.holds.has(holdId);
  }

  /** Counters of the hold (empty: held for its rate limits only). */
  countersOf(holdId: number): CounterHolds[] {
    return this.holds.get(holdId)?.counters ?? [];
  }

  /** Hold the amounts on every (counter, period) once; the hold's id. */
  reserve(counters: [string, string][], nanos: number, tokens: number, requests: number, nowUs: number): number {
    const holdId = this.nextId++;
    const named: CounterHolds[] = [];
    for (const [counter, period] of counters) {
      const key = counterPeriod(counter, period);
      let totals = this.held.get(key);
      if (totals === undefined) {
        totals = { key, counter, period, nanos, tokens, requests, holds: 1, lastHold: holdId };
        this.held.set(key, totals);
        named.push(totals);
        continue;
      }
      if (totals.lastHold === holdId) continue; // the same counter twice: held once
      totals.nanos += nanos;
      totals.tokens += tokens;
      totals.requests += requests;
      totals.holds += 1;
      totals.lastHold = holdId;
      named.push(totals);
    }
    this.holds.set(holdId, { holdId, nanos, tokens, requests, expiresUs: nowUs + this.timeoutUs, counters: named, occurredUs: null, seqs: [] });
    return holdId;
  }

  /** Replace the estimate with the actual cost; false if the hold is gone or settled. */
  settle(
    holdId: number,
    nanos: number,
    tokens: number,
    requests: number,
    occurredUs: number,
    nowUs: number,
    seqs: Map<string, number>,
  ): boolean {
    const hold = this.holds.get(holdId);
    if (hold === undefined || hold.occurredUs !== null) return false;
    for (const totals of hold.counters) {
      totals.nanos += nanos - hold.nanos;
      totals.tokens += tokens - hold.tokens;
      totals.requests += requests - hold.requests;
      let ids = this.settled.get(totals.key);
      if (ids === undefined) this.settled.set(totals.key, (ids = new Set()));
      ids.add(holdId);
    }
    this.holds.delete(holdId); // re-inserted last: its new deadline is the latest
    this.holds.set(holdId, {
      ...hold,
      nanos,
      tokens,
      requests,
      expiresUs: nowUs + this.timeoutUs,
      occurredUs,
      seqs: hold.counters.map((t) => seqs.get(t.key) ?? -1),
    });
    return true;
  }

  /** Drop a hold entirely (the request never reached the provider). */
  release(holdId: number): boolean {
    const hold = this.holds.get(holdId);
    if (hold === undefined) return false;
    this.holds.delete(holdId);
    for (const totals of hold.counters) {
      if (hold.occurredUs !== null) this.unsettle(totals.key, holdId);
      this.take(totals, hold);
    }
    return true;
  }

  /** A verdict arrived: drop the settled holds it covers on that counter and period. */
  onVerdict(counter: string, period: string, asOfUs: number, seq: number): number {
    const key = counterPeriod(counter, period);
    const ids = this.settled.get(key);
    if (ids === undefined) return 0;
    let dropped = 0;
    for (const holdId of [...ids]) {
      const hold = this.holds.get(holdId)!;
      const i = hold.counters.findIndex((t) => t.key === key);
      if (hold.occurredUs! <= asOfUs && seq > hold.seqs[i]) {
        this.take(hold.counters[i], hold);
        this.unsettle(key, holdId);
        const counters = hold.counters.filter((_, j) => j !== i);
        if (counters.length > 0) this.holds.set(holdId, { ...hold, counters, seqs: hold.seqs.filter((_, j) => j !== i) });
        else this.holds.delete(holdId);
        dropped++;
      }
    }
    this.droppedByVerdict += dropped;
    return dropped;
  }

  /** Drop every hold past its deadline; how many. */
  expire(nowUs: number): number {
    const expired = [...this.holds.values()].filter((h) => h.expiresUs <= nowUs).map((h) => h.holdId);
    for (const holdId of expired) this.release(holdId);
    this.droppedByTimeout += expired.length;
    return expired.length;
  }

  private take(totals: CounterHolds, hold: Hold): void {
    if (totals.holds > 1) {
      totals.nanos -= hold.nanos;
      totals.tokens -= hold.tokens;
      totals.requests -= hold.requests;
      totals.holds -= 1;
    } else {
      this.held.delete(totals.key);
    }
  }

  private unsettle(key: string, holdId: number): void {
    const ids = this.settled.get(key);
    if (ids === undefined) return;
    ids.delete(holdId);
    if (ids.size === 0) this.settled.delete(key);
  }
}
