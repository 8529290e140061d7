/**
 * Avro single-object encoding, as spendbus's codec writes it (schemas/codec.py):
 * `C3 01`, the CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form
 * (8 bytes, little-endian), then the Avro binary body. No record headers, no registry.
 *
 * The schemas are the standalone files of schemas/avro/standalone/ and every released
 * version of schemas/avro/history/, copied into dist/schemas by the build
 * (scripts/copy-schemas.js): each file parses alone. A record written with a released
 * version is read into the current one by Avro's schema resolution, as the Python codec
 * reads it (fields the writer did not have take their defaults).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import * as avro from "avsc";

export const MAGIC = Buffer.from([0xc3, 0x01]);
export const HEADER_LENGTH = 10;

const EMPTY = 0xc15d213aa4d7a795n;
const MASK64 = (1n << 64n) - 1n;
const TABLE: bigint[] = (() => {
  const table: bigint[] = [];
  for (let i = 0; i < 256; i++) {
    let fp = BigInt(i);
    for (let j = 0; j < 8; j++) {
      fp = (fp >> 1n) ^ (EMPTY & (-(fp & 1n) & MASK64));
    }
    table.push(fp);
  }
  return table;
})();

/** CRC-64-AVRO (Rabin) of `bytes`, as the Avro specification defines it. */
export function rabinFingerprint(bytes: Uint8Array): Buffer {
  let fp = EMPTY;
  for (const byte of bytes) {
    fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(byte)) & 0xffn)];
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out;
}

/** The writer schemas this client reads and writes, by name. */
export type SchemaName = "UsageEvent" | "Verdict" | "BudgetPolicy" | "BudgetRaise" | "GenerationSwitch" | "PriceTable";

/** Where the build put the standalone .avsc files (overridable for a checkout). */
export function schemaDir(): string {
  return process.env.SPENDBUS_AVRO_DIR ?? path.join(__dirname, "..", "schemas");
}

/** timestamp-micros as a number of microseconds since the epoch (exact below 2^53). */
class MicrosType extends avro.types.LogicalType {
  override _fromValue(value: number): number {
    return value;
  }
  override _toValue(value: unknown): number {
    if (typeof value === "number" && Number.isSafeInteger(value)) return value;
    if (typeof value === "bigint") return Number(value);
    if (value instanceof Date) return value.getTime() * 1000;
    throw new TypeError(`timestamp-micros: expected microseconds since the epoch, got ${String(value)}`);
  }
  override _resolve(type: avro.Type): ((value: number) => number) | undefined {
    return avro.Type.isType(type, "long", "logical:timestamp-micros") ? (v: number) => v : undefined;
  }
}

/** One record type: its parsed schema, its header and the single-object codec. */
export class Codec {
  readonly header: Buffer;
  /** fingerprint (hex) of each released version -> its resolver into the current schema */
  private readonly writers = new Map<string, avro.Resolver>();

  constructor(
    readonly name: SchemaName,
    readonly type: avro.Type,
    released: avro.Type[] = [],
  ) {
    this.header = Buffer.concat([MAGIC, fingerprintOf(type)]);
    for (const writer of released) {
      const fingerprint = fingerprintOf(writer).toString("hex");
      if (fingerprint !== this.header.subarray(2).toString("hex")) {
        this.writers.set(fingerprint, type.createResolver(writer));
      }
    }
  }

  /** The record's single-object encoding; throws naming the field a value does not fit. */
  encode(record: Record<string, unknown>): Buffer {
    const problems: string[] = [];
    const valid = this.type.isValid(record, {
      errorHook: (path: string[], value: unknown) => {
        problems.push(`${path.join(".") || "<record>"}: ${JSON.stringify(value) ?? String(value)}`);
      },
    });
    if (!valid) {
      throw new TypeError(`${this.name}: not a valid record (${problems.join("; ")})`);
    }
    return Buffer.concat([this.header, this.type.toBuffer(record)]);
  }

  /** Decode one single-object encoded value written with this schema's current version. */
  decode(value: Buffer): Record<string, unknown> {
    if (value.length < HEADER_LENGTH || value[0] !== 0xc3 || value[1] !== 0x01) {
      throw new ContractViolation("bad_magic", `${this.name}: not Avro single-object encoded`);
    }
    const body = value.subarray(HEADER_LENGTH);
    if (value.subarray(0, HEADER_LENGTH).equals(this.header)) {
      return this.type.fromBuffer(body) as Record<string, unknown>;
    }
    const fingerprint = value.subarray(2, HEADER_LENGTH).toString("hex");
    const resolver = this.writers.get(fingerprint);
    if (resolver === undefined) {
      throw new ContractViolation(
        "unknown_fingerprint",
        `${this.name}: unknown schema fingerprint ${fingerprint} (written by a newer or foreign producer?)`,
      );
    }
    return this.type.fromBuffer(body, resolver) as Record<string, unknown>;
  }
}

/** A record the contract refuses (bad framing, another schema version, a malformed key). */
export class ContractViolation extends Error {
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
    this.name = "ContractViolation";
  }
}

const codecs = new Map<SchemaName, Codec>();

/** The 8 header bytes of `type`: CRC-64-AVRO of its Parsing Canonical Form. */
function fingerprintOf(type: avro.Type): Buffer {
  return rabinFingerprint(Buffer.from(JSON.stringify(type.schema()), "utf8"));
}

function parseFile(file: string): avro.Type {
  return avro.Type.forSchema(JSON.parse(fs.readFileSync(file, "utf8")), {
    logicalTypes: { "timestamp-micros": MicrosType },
  });
}

/** The codec of `name`, parsed once from its standalone file and its released versions. */
export function codecFor(name: SchemaName): Codec {
  let codec = codecs.get(name);
  if (codec === undefined) {
    const history = path.join(schemaDir(), "history", name);
    const released = fs.existsSync(history)
      ? fs
          .readdirSync(history)
          .filter((f) => /^v\d+\.avsc$/.test(f))
          .map((f) => parseFile(path.join(history, f)))
      : [];
    codec = new Codec(name, parseFile(path.join(schemaDir(), `${name}.avsc`)), released);
    codecs.set(name, codec);
  }
  return codec;
}
