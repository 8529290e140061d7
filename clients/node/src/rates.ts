/**
 * Rate limits (enforcer/rates.py, enforcer/throttle.py): one token bucket per (counter,
 * rate limit) on this process, refilled at its replica's share of the rate. A request takes
 * 1 from a request bucket (which needs a whole one) and its worst case from a token bucket
 * (which needs a level above 0, and may go into debt); settle gives back the tokens the
 * worst case took beyond what was used, release gives back everything.
 */

/** a bucket holds this fraction of its window's count, and at least 2 requests or one token */
const BURST_FRACTION = 1 / 60;
const MIN_REQUESTS_BURST = 2.0;
const MAX_BUCKETS = 100_000;

/** One rate limit of a budget: [tokens (not requests), count, window µs]. */
export type RateSpec = [boolean, number, number];

export class RateBucket {
  largest = 1.0;
  level: number;
  updatedUs: number;

  constructor(
    readonly tokens: boolean,
    readonly count: number,
    readonly windowUs: number,
    share: number,
    nowUs: number,
  ) {
    this.level = this.capacity(share);
    this.updatedUs = nowUs;
  }

  capacity(share: number): number {
    const least = this.tokens ? this.largest : MIN_REQUESTS_BURST;
    return Math.max(least, (this.count / share) * BURST_FRACTION);
  }

  refill(nowUs: number, share: number): number {
    if (nowUs > this.updatedUs) {
      const cap = this.capacity(share);
      if (this.level < cap) {
        const level = this.level + ((nowUs - this.updatedUs) * this.count) / (this.windowUs * share);
        this.level = level > cap ? cap : level;
      }
      this.updatedUs = nowUs;
    }
    return this.level;
  }

  /** µs until this bucket admits again (0: it does now). */
  waitUs(share: number): number {
    const need = this.tokens ? -this.level : 1.0 - this.level;
    if (need <= 0 && (this.tokens || this.level >= 1.0)) return 0;
    const wait = (need * this.windowUs * share) / this.count;
    const whole = Math.trunc(wait);
    return whole < wait ? whole + 1 : whole;
  }
}

/** The rates of a budget's `rate:` record, in the order rates.py reads them. */
export function rateSpecs(rate: Record<string, number | null> | null | undefined): RateSpec[] {
  if (rate === null || rate === undefined) return [];
  const out: RateSpec[] = [];
  for (const unit of ["requests", "tokens"]) {
    for (const [window, seconds] of [
      ["second", 1],
      ["minute", 60],
    ] as const) {
      const count = rate[`${unit}_per_${window}`];
      if (count !== null && count !== undefined) out.push([unit === "tokens", count, seconds * 1_000_000]);
    }
  }
  return out;
}

/** What one admitted request took: (bucket, tokens or 1 request) per bucket. */
export type Charges = [RateBucket, number][];

/** This process's buckets, one per (counter key, index into the budget's rates). */
export class RateBuckets {
  private readonly buckets = new Map<string, RateBucket>();

  bucketFor(counter: string, index: number, spec: RateSpec, share: number, nowUs: number): RateBucket {
    const key = `${index}|${counter}`;
    let bucket = this.buckets.get(key);
    if (bucket === undefined) {
      if (this.buckets.size >= MAX_BUCKETS) {
        for (const [k, b] of this.buckets) if (b.refill(nowUs, share) >= b.capacity(share)) this.buckets.delete(k);
      }
      bucket = new RateBucket(spec[0], spec[1], spec[2], share, nowUs);
      this.buckets.set(key, bucket);
    }
    return bucket;
  }
}

/** Settle: give back the tokens taken beyond `usedTokens`; release (never sent): everything. */
export function refund(charges: Charges, usedTokens: number, sent: boolean): void {
  for (const [bucket, taken] of charges) {
    if (bucket.tokens) bucket.level += taken - (sent ? usedTokens : 0);
    else if (!sent) bucket.level += taken;
  }
}
