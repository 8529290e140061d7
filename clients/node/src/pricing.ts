/**
 * The price book, as far as a check reads it (schemas/pricing/): which entry of the
 * version in force prices a model (its id's forms and snapshot suffixes, the longest
 * match, else the fallback), and a request's worst case — its input and max output
 * tokens at the entry's prices (the long-context tier's above its edge), plus the billed
 * units it names at their unit prices — in exact decimal arithmetic, rounded once to the
 * nearest nano, ties to even, as schemas/pricing/exact_cost.py does.
 */

import { strip } from "./ids";

/** An exact non-negative rational, numerator over denominator. */
interface Ratio {
  num: bigint;
  den: bigint;
}

/** A decimal string (as PriceTable records carry prices: `3.00`, `0.15`, `1E+1`). */
export function parseDecimal(text: string): Ratio {
  const match = /^\s*([+]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*$/.exec(text);
  if (!match || (match[2] === "" && (match[3] ?? "") === "")) throw new Error(`not a decimal price: ${JSON.stringify(text)}`);
  const fraction = match[3] ?? "";
  let num = BigInt((match[2] || "0") + fraction);
  let den = 10n ** BigInt(fraction.length);
  const exponent = Number(match[4] ?? "0");
  if (exponent > 0) num *= 10n ** BigInt(exponent);
  else if (exponent < 0) den *= 10n ** BigInt(-exponent);
  return { num, den };
}

interface ModelPrice {
  match: string;
  input: Ratio;
  output: Ratio;
  /** the long-context tier: above this many prompt tokens, its input and output prices */
  longContext: { above: number; input: Ratio; output: Ratio } | null;
  /** USD per billed unit */
  units: Map<string, Ratio>;
}

function modelPriceOf(record: Record<string, unknown>): ModelPrice {
  const tier = record.long_context as Record<string, unknown> | null;
  return {
    match: record.match as string,
    input: parseDecimal(record.input_per_mtok as string),
    output: parseDecimal(record.output_per_mtok as string),
    longContext:
      tier === null
        ? null
        : {
            above: tier.above_input_tokens as number,
            input: parseDecimal(tier.input_per_mtok as string),
            output: parseDecimal(tier.output_per_mtok as string),
          },
    units: new Map(Object.entries((record.unit_prices as Record<string, string>) ?? {}).map(([u, p]) => [u, parseDecimal(p)])),
  };
}

const GEOGRAPHIES = new Set(["us", "eu", "apac", "global", "us-gov", "jp", "au", "ca", "uk", "in", "sa"]);
const VENDORS = new Set([
  "anthropic",
  "amazon",
  "meta",
  "mistral",
  "cohere",
  "ai21",
  "deepseek",
  "openai",
  "qwen",
  "writer",
  "google",
  "moonshot",
  "minimax",
  "nvidia",
  "twelvelabs",
  "stability",
  "luma",
]);
const SNAPSHOT_SUFFIX = new RegExp(
  "^(?:-0)?" +
    "(?:-(?:preview|exp)(?:-[01]\\d-(?:[0-3]\\d|20\\d\\d))?)?" +
    "(?:-latest)?" +
    "(?:-(?:20\\d\\d-[01]\\d-[0-3]\\d|20\\d{6}|(?:0[1-9]|1[0-2])[0-3]\\d|0\\d\\d))?" +
    "(?:-preview)?" +
    "(?:-(?:v\\d+(?::\\d+)?|\\d+:\\d+)(?::\\d+k)?)?$",
);

/** The forms of a model id tried in turn (schemas/pricing/model_ids.py model_id_forms). */
export function modelIdForms(model: string): string[] {
  const out = [model];
  let form = strip(model).toLowerCase();
  form = form.slice(form.lastIndexOf("/") + 1).replace(/@/g, "-");
  if (form.startsWith("ft:")) form = form.split(":").slice(0, 2).join(":");
  if (form !== model) out.push(form);
  for (const labels of [GEOGRAPHIES, VENDORS]) {
    const dot = form.indexOf(".");
    if (dot >= 0 && dot < form.length - 1 && labels.has(form.slice(0, dot))) {
      form = form.slice(dot + 1);
      out.push(form);
    }
  }
  return out;
}

class PriceTable {
  readonly byMatch = new Map<string, ModelPrice>();
  readonly lengths: number[];
  readonly fallback: ModelPrice | null;

  constructor(
    readonly version: string,
    readonly effectiveFromUs: number,
    record: Record<string, unknown>,
  ) {
    for (const m of record.models as Record<string, unknown>[]) {
      const price = modelPriceOf(m);
      this.byMatch.set(price.match, price);
    }
    // Python compares lengths in code points; a model id is ASCII in practice, and
    // Array.from counts code points either way
    this.lengths = [...new Set([...this.byMatch.keys()].map((m) => Array.from(m).length))].sort((a, b) => b - a);
    const fallback = record.fallback as Record<string, unknown> | null;
    this.fallback = fallback === null ? null : modelPriceOf(fallback);
  }

  /** The entry that prices `model`, else the fallback, else null (unpriced). */
  resolve(model: string): ModelPrice | null {
    for (const form of modelIdForms(model)) {
      const chars = Array.from(form);
      for (const length of this.lengths) {
        if (length <= chars.length) {
          const price = this.byMatch.get(chars.slice(0, length).join(""));
          const rest = chars.slice(length).join("");
          if (price !== undefined && (rest === "" || SNAPSHOT_SUFFIX.test(rest))) return price;
        }
      }
    }
    return this.fallback;
  }
}

/** Every price version of the `pricing` topic; the one in force at a time. */
export class PriceBook {
  private readonly byVersion = new Map<string, PriceTable>();
  private order: PriceTable[] = [];

  apply(version: string, record: Record<string, unknown> | null): void {
    if (record === null) this.byVersion.delete(version);
    else this.byVersion.set(version, new PriceTable(record.version as string, record.effective_from as number, record));
    this.order = [...this.byVersion.values()].sort((a, b) =>
      a.effectiveFromUs !== b.effectiveFromUs ? a.effectiveFromUs - b.effectiveFromUs : a.version < b.version ? -1 : a.version > b.version ? 1 : 0,
    );
  }

  /** The version in force at `us` (the latest effective_from <= us), or null. */
  tableAt(us: number): PriceTable | null {
    let found: PriceTable | null = null;
    for (const table of this.order) {
      if (table.effectiveFromUs <= us) found = table;
      else break;
    }
    return found;
  }

  /** No entry nor fallback prices `model` at `us`. */
  unpriced(model: string, us: number): boolean {
    const table = this.tableAt(us);
    return table === null || table.resolve(model) === null;
  }

  /** The worst case of a request in nanos (0 when unpriced): `inputTokens` and
   * `outputTokens` at the prices of the entry in force, plus `units` at their unit prices. */
  worstCaseNanos(model: string, us: number, inputTokens: number, outputTokens: number, units: Map<string, number> | null): number {
    const price = this.tableAt(us)?.resolve(model) ?? null;
    if (price === null) return 0;
    const tier = price.longContext !== null && price.longContext.above < inputTokens ? price.longContext : null;
    const terms: Ratio[] = [
      times(tier?.input ?? price.input, BigInt(inputTokens) * 1000n),
      times(tier?.output ?? price.output, BigInt(outputTokens) * 1000n),
    ];
    for (const [unit, count] of units ?? []) {
      const usd = price.units.get(unit);
      if (usd !== undefined) terms.push(times(usd, BigInt(count) * 1_000_000_000n));
    }
    return Number(roundHalfEven(terms));
  }
}

/** `price` (USD per Mtok, or per unit) times `factor`. */
function times(price: Ratio, factor: bigint): Ratio {
  return { num: price.num * factor, den: price.den };
}

function roundHalfEven(terms: Ratio[]): bigint {
  let den = 1n;
  for (const t of terms) den = lcm(den, t.den);
  let num = 0n;
  for (const t of terms) num += t.num * (den / t.den);
  const quotient = num / den;
  const twice = (num % den) * 2n;
  return twice > den || (twice === den && quotient % 2n === 1n) ? quotient + 1n : quotient;
}

function gcd(a: bigint, b: bigint): bigint {
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

function lcm(a: bigint, b: bigint): bigint {
  return (a / gcd(a, b)) * b;
}
