/**
 * A rolling window's spend at any time, from what its verdict carries (schemas/rolling.py):
 * the buckets still in the window at the verdict's `as_of`, by age; each leaves the window
 * at its own time, and every reader drops those that left by its own clock.
 */
import { ContractViolation } from "./avro";
import { parseWindow, Window } from "./periods";

export const ROLLING_BUCKETS = 48;

/** The rolling window whose period key is `period` (`r:5h`), null for any other key. */
export function rollingWindowOf(period: string): Window | null {
  const match = /^r:(\d+[mhdw])$/.exec(period);
  return match === null ? null : parseWindow(`rolling:${match[1]}`);
}

function bucketUs(window: Window): number {
  return Math.floor(window.rollingUs / ROLLING_BUCKETS);
}

/** When the bucket `age` buckets before `asOfUs`'s leaves the window (µs). */
export function leavesAtUs(window: Window, asOfUs: number, age: number): number {
  const width = bucketUs(window);
  return (Math.floor(asOfUs / width) - age + ROLLING_BUCKETS) * width;
}

/** `leavesAt` ascending; at index k the spend left once the first k buckets have gone. */
export class RollingSpend {
  constructor(
    readonly leavesAt: number[],
    readonly nanos: number[],
    readonly tokens: number[],
    readonly requests: number[],
  ) {}

  get firstLeavesAtUs(): number | null {
    return this.leavesAt.length > 0 ? this.leavesAt[0] : null;
  }

  private gone(nowUs: number): number {
    let k = 0;
    while (k < this.leavesAt.length && this.leavesAt[k] <= nowUs) k++;
    return k;
  }

  /** [nanos, tokens, requests] still in the window at `nowUs`. */
  at(nowUs: number): [number, number, number] {
    const k = this.gone(nowUs);
    return [this.nanos[k], this.tokens[k], this.requests[k]];
  }

  /** The first time from `nowUs` at which what is left is under every limit with room for
   * `needs`: `nowUs` if it fits already, null if it never will. */
  fitsAt(nowUs: number, limits: (number | null)[], needs: number[]): number | null {
    const first = this.gone(nowUs);
    const spent = [this.nanos, this.tokens, this.requests];
    for (let k = first; ; k++) {
      if (limits.every((limit, j) => limit === null || (spent[j][k] < limit && spent[j][k] + needs[j] <= limit))) {
        return k === first ? nowUs : this.leavesAt[k - 1];
      }
      if (k === this.leavesAt.length) return null;
    }
  }
}

/** The spend of a rolling window's Verdict record, or null for another window. */
export function rollingSpend(record: Record<string, unknown>): RollingSpend | null {
  const window = rollingWindowOf(record.period as string);
  if (window === null) return null;
  const asOfUs = record.as_of as number;
  const ages = (record.bucket_ages as number[] | undefined) ?? [];
  const columns = ["bucket_nanos", "bucket_tokens", "bucket_requests"].map((n) => (record[n] as number[] | undefined) ?? []);
  if (columns.some((column) => column.length !== ages.length)) {
    throw new ContractViolation(
      "bad_buckets",
      `verdict ${JSON.stringify(record.counter_key)}: bucket_ages, bucket_nanos, bucket_tokens and bucket_requests differ in length`,
    );
  }
  const totals = [record.spent_nanos as number, record.spent_tokens as number, record.spent_requests as number];
  const byTime = new Map<number, number[]>();
  const sumsAt = (at: number): number[] => {
    let sums = byTime.get(at);
    if (sums === undefined) byTime.set(at, (sums = [0, 0, 0]));
    return sums;
  };
  ages.forEach((age, i) => {
    if (!(age >= 0 && age < ROLLING_BUCKETS)) {
      throw new ContractViolation(
        "bad_buckets",
        `verdict ${JSON.stringify(record.counter_key)}: bucket age ${age} outside 0-${ROLLING_BUCKETS - 1}`,
      );
    }
    const sums = sumsAt(leavesAtUs(window, asOfUs, age));
    for (let j = 0; j < 3; j++) sums[j] += columns[j][i];
  });
  const carried = [0, 1, 2].map((j) => [...byTime.values()].reduce((sum, s) => sum + s[j], 0));
  const rest = totals.map((total, j) => total - carried[j]);
  if (rest.some((r) => r < 0)) {
    throw new ContractViolation("bad_buckets", `verdict ${JSON.stringify(record.counter_key)}: its buckets sum past its spend`);
  }
  if (rest.some((r) => r !== 0)) {
    const newest = sumsAt(leavesAtUs(window, asOfUs, 0));
    for (let j = 0; j < 3; j++) newest[j] += rest[j];
  }
  const leaves = [...byTime.keys()].sort((a, b) => a - b);
  const nanos = [totals[0]];
  const tokens = [totals[1]];
  const requests = [totals[2]];
  for (const at of leaves) {
    const gone = byTime.get(at)!;
    nanos.push(nanos[nanos.length - 1] - gone[0]);
    tokens.push(tokens[tokens.length - 1] - gone[1]);
    requests.push(requests[requests.length - 1] - gone[2]);
  }
  return new RollingSpend(leaves, nanos, tokens, requests);
}
