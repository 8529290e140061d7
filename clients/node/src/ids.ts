/**
 * Canonical ids and counter keys (schemas/ids.py, schemas/topics.py): the key of a
 * usage.raw record, and the length-prefixed counter keys of the verdict topic.
 */
import { ContractViolation } from "./avro";

export const MAX_ID_LENGTH = 512;
/** scope attributes whose values are case-insensitive identities (schemas.ids) */
export const CASE_INSENSITIVE_ATTRIBUTES = new Set(["user_id"]);

/** Python's str.strip(): every character Python counts as whitespace, at both ends. */
const PY_SPACE =
  "[\\t\\n\\v\\f\\r\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, "gu");

export function strip(value: string): string {
  return value.replace(STRIP, "");
}

/** Length in code points, as Python's len() counts a str. */
export function codePoints(value: string): number {
  let n = 0;
  for (const _ of value) n++;
  return n;
}

/** Surrounding blanks removed; user ids lower-cased (schemas.ids.canonical_id). */
export function canonicalId(value: string, attribute = ""): string {
  const stripped = strip(value);
  return CASE_INSENSITIVE_ATTRIBUTES.has(attribute) ? stripped.toLowerCase() : stripped;
}

/** The key of a usage.raw record: the UTF-8 of the event's canonical org_id. */
export function usageRawKey(orgId: string): Buffer {
  return Buffer.from(canonicalId(orgId, "org_id"), "utf8");
}

/** Length-prefixed, unambiguous concatenation (lengths in code points). */
export function compose(parts: readonly string[]): string {
  return parts.map((part) => `${codePoints(part)}:${part},`).join("");
}

/** Inverse of compose; throws on a malformed key. */
export function decompose(key: string): string[] {
  const chars = Array.from(key);
  const parts: string[] = [];
  let pos = 0;
  while (pos < chars.length) {
    let colon = pos;
    while (colon < chars.length && chars[colon] !== ":") colon++;
    const digits = chars.slice(pos, colon).join("");
    if (colon >= chars.length || !/^[0-9]+$/.test(digits)) {
      throw new ContractViolation("bad_key", `malformed composed key at position ${pos}: ${JSON.stringify(key)}`);
    }
    const end = colon + 1 + Number(digits);
    if (end >= chars.length || chars[end] !== ",") {
      throw new ContractViolation("bad_key", `malformed composed key at position ${pos}: ${JSON.stringify(key)}`);
    }
    parts.push(chars.slice(colon + 1, end).join(""));
    pos = end + 1;
  }
  return parts;
}
