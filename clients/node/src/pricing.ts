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

/** USD per Mtok of the five token classes: input, cache read, 5-minute cache write,
 * 1-hour cache write, output (TOKEN_PRICE_FIELDS' order). */
type Prices = [Ratio, Ratio, Ratio, Ratio, Ratio];
const TOKEN_PRICE_FIELDS = [
  "input_per_mtok",
  "cache_read_per_mtok",
  "cache_write_per_mtok",
  "cache_write_1h_per_mtok",
  "output_per_mtok",
];
/** defaults of the cache prices, as multiples of the input price */
const DEFAULT_CACHE_RATIOS = [parseDecimal("0.1"), parseDecimal("1.25"), parseDecimal("2")];

interface ModelPrice {
  match: string;
  base: Prices;
  /** the long-context tier: above this many prompt tokens (input + cache), its prices */
  longContext: { above: number; prices: Prices } | null;
  /** USD per billed unit */
  units: Map<string, Ratio>;
  /** service tier -> multiplier of every token price */
  tierFactors: Map<string, Ratio>;
  /** service tier -> the class rates it bills apart (field name -> USD per Mtok) */
  tierRates: Map<string, Map<string, Ratio>>;
}

function mul(a: Ratio, b: Ratio): Ratio {
  return { num: a.num * b.num, den: a.den * b.den };
}

function div(a: Ratio, b: Ratio): Ratio {
  return { num: a.num * b.den, den: a.den * b.num };
}

function modelPriceOf(record: Record<string, unknown>): ModelPrice {
  const input = parseDecimal(record.input_per_mtok as string);
  const cache = (field: string, i: number): Ratio => {
    const given = record[field] as string | null | undefined;
    return given === null || given === undefined ? mul(input, DEFAULT_CACHE_RATIOS[i]) : parseDecimal(given);
  };
  const base: Prices = [
    input,
    cache("cache_read_per_mtok", 0),
    cache("cache_write_per_mtok", 1),
    cache("cache_write_1h_per_mtok", 2),
    parseDecimal(record.output_per_mtok as string),
  ];
  const tier = record.long_context as Record<string, unknown> | null;
  let longContext: ModelPrice["longContext"] = null;
  if (tier !== null && tier !== undefined) {
    // cache prices above the edge scale as input does
    const tierInput = parseDecimal(tier.input_per_mtok as string);
    const ratio = div(tierInput, input);
    longContext = {
      above: tier.above_input_tokens as number,
      prices: [tierInput, mul(base[1], ratio), mul(base[2], ratio), mul(base[3], ratio), parseDecimal(tier.output_per_mtok as string)],
    };
  }
  const named = (field: string): [string, string][] => Object.entries((record[field] as Record<string, string> | undefined) ?? {});
  return {
    match: record.match as string,
    base,
    longContext,
    units: new Map(named("unit_prices").map(([u, p]) => [u, parseDecimal(p)])),
    tierFactors: new Map(named("service_tiers").map(([t, f]) => [t, parseDecimal(f)])),
    tierRates: new Map(
      Object.entries((record.service_tier_rates as Record<string, Record<string, string>> | undefined) ?? {}).map(([t, rates]) => [
        t,
        new Map(Object.entries(rates).map(([name, rate]) => [name, parseDecimal(rate)])),
      ]),
    ),
  };
}

/** (base prices, long-context prices) of a call served by `tier` (ModelPrice.prices_in_tier):
 * a class's rate in the tier, else its price times the tier's multiplier; above the edge a
 * tier rate scales as its price does, unless the tier names its rate there. */
function pricesInTier(price: ModelPrice, tier: string | null): [Prices, Prices | null] {
  const long = price.longContext?.prices ?? null;
  if (tier === null || (!price.tierFactors.has(tier) && !price.tierRates.has(tier))) return [price.base, long];
  const factor = price.tierFactors.get(tier) ?? { num: 1n, den: 1n };
  const given = price.tierRates.get(tier) ?? new Map<string, Ratio>();
  const inTier = (prices: Prices, longContext: boolean): Prices => {
    const out = prices.map((p) => mul(p, factor));
    TOKEN_PRICE_FIELDS.forEach((name, index) => {
      const rate = given.get(name);
      if (rate !== undefined) {
        out[index] = rate;
        if (longContext) {
          const scale = name === "output_per_mtok" ? 4 : 0; // output scales as output, the rest as input
          out[index] = mul(out[index], div(prices[scale], price.base[scale]));
        }
      }
      if (longContext) {
        const above = given.get(`long_context_${name}`);
        if (above !== undefined) out[index] = above;
      }
    });
    return out as Prices;
  };
  return [inTier(price.base, false), long === null ? null : inTier(long, true)];
}

/** The token counts a price applies to. */
export interface PricedTokens {
  input: number;
  cacheRead: number;
  cacheWrite: number;
  cacheWrite1h: number;
  output: number;
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
    const tokens = { input: inputTokens, cacheRead: 0, cacheWrite: 0, cacheWrite1h: 0, output: outputTokens };
    return this.priceNanos(model, us, tokens, units, null);
  }

  /** The cost of one call in nanos (PriceBook.price): every token class at the prices of
   * the entry in force at `us` (the long-context tier's above its edge, the service tier's),
   * plus its billed units; rounded once, to the nearest nano, ties to even. 0 when unpriced. */
  priceNanos(
    model: string,
    us: number,
    tokens: PricedTokens,
    units: Map<string, number> | null,
    serviceTier: string | null,
  ): number {
    const price = this.tableAt(us)?.resolve(model) ?? null;
    if (price === null) return 0;
    const [base, long] = pricesInTier(price, serviceTier);
    const prompt = tokens.input + tokens.cacheRead + tokens.cacheWrite;
    const rates = long !== null && price.longContext!.above < prompt ? long : base;
    const counts = [tokens.input, tokens.cacheRead, tokens.cacheWrite - tokens.cacheWrite1h, tokens.cacheWrite1h, tokens.output];
    const terms: Ratio[] = rates.map((rate, i) => times(rate, BigInt(counts[i]) * 1000n));
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
