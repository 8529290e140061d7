/**
 * Avro single-object encoding, as spendbus's codec writes it (schemas/codec.py):
 * `C3 01`, the CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form
 * (8 bytes, little-endian), then the Avro binary body. No record headers, no registry.
 *
 * The schemas are the standalone files of schemas/avro/standalone/, copied into
 * dist/schemas by the build (scripts/copy-schemas.js): one file parses alone.
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

  constructor(
    readonly name: SchemaName,
    readonly type: avro.Type,
  ) {
    const canonical = JSON.stringify(type.schema());
    this.header = Buffer.concat([MAGIC, rabinFingerprint(Buffer.from(canonical, "utf8"))]);
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
    if (!value.subarray(0, HEADER_LENGTH).equals(this.header)) {
      throw new ContractViolation(
        "unknown_fingerprint",
        `${this.name}: written with schema fingerprint ${value.subarray(2, HEADER_LENGTH).toString("hex")}, ` +
          `not the current one (${this.header.subarray(2).toString("hex")}); this client reads the current version only`,
      );
    }
    return this.type.fromBuffer(value.subarray(HEADER_LENGTH)) as Record<string, unknown>;
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

/** The codec of `name`, parsed once from its standalone file. */
export function codecFor(name: SchemaName): Codec {
  let codec = codecs.get(name);
  if (codec === undefined) {
    const text = fs.readFileSync(path.join(schemaDir(), `${name}.avsc`), "utf8");
    const type = avro.Type.forSchema(JSON.parse(text), {
      logicalTypes: { "timestamp-micros": MicrosType },
    });
    codec = new Codec(name, type);
    codecs.set(name, codec);
  }
  return codec;
}
