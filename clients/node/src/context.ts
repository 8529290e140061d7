/**
 * The request context a proxy builds per request (enforcer/context.py): validated once,
 * with the canonical values every counter is looked up by.
 */
import { canonicalId, codePoints, MAX_ID_LENGTH, strip } from "./ids";
import { pyRepr } from "./refusals";

export const MAX_GROUPS = 256;
export const MAX_TAGS = 64;
export const MAX_TOKENS_PER_EVENT = 100_000_000;
export const MAX_REQUEST_BYTES = 2 ** 40;
export const MAX_CANDIDATES = 128;

/** What a proxy knows of one request (the sidecar's JSON context, snake_case). */
export interface RequestContext {
  org_id: string;
  secret_id: string;
  project_id?: string | null;
  grant_id?: string | null;
  permission_id?: string | null;
  user_id?: string | null;
  groups?: string[];
  session_id?: string | null;
  tags?: Record<string, string> | null;
  provider?: string | null;
  api?: string | null;
  model?: string | null;
  input_tokens?: number | null;
  request_bytes?: number | null;
  max_output_tokens?: number | null;
  candidates?: number | null;
  units?: Record<string, number> | null;
}

const FIELDS = new Set([
  "org_id",
  "secret_id",
  "project_id",
  "grant_id",
  "permission_id",
  "user_id",
  "groups",
  "session_id",
  "tags",
  "provider",
  "api",
  "model",
  "input_tokens",
  "request_bytes",
  "max_output_tokens",
  "candidates",
  "units",
]);

/** A context field that is not what the contract allows (a 400 naming the field). */
export class InvalidContext extends Error {
  constructor(
    readonly field: string,
    readonly problem: string,
  ) {
    super(`${field}: ${problem}`);
    this.name = "InvalidContext";
  }
}

function id(name: string, value: unknown): string[] {
  if (typeof value !== "string") throw new InvalidContext(name, "must be a string or null");
  if (codePoints(value) > MAX_ID_LENGTH) throw new InvalidContext(name, `longer than ${MAX_ID_LENGTH} characters`);
  const canonical = canonicalId(value, name);
  return canonical ? [canonical] : [];
}

function required(name: string, value: unknown): string {
  if (typeof value !== "string" || !strip(value)) throw new InvalidContext(name, "required, a non-empty string");
  if (codePoints(value) > MAX_ID_LENGTH) throw new InvalidContext(name, `longer than ${MAX_ID_LENGTH} characters`);
  return canonicalId(value, name);
}

function count(name: string, value: unknown, bound: number): void {
  if (value === null || value === undefined) return;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > bound) {
    throw new InvalidContext(name, `an integer in 0..${bound} or null`);
  }
}

export const MAX_UNIT_CAPS = 32;
export const MAX_UNITS_PER_EVENT = 100_000_000;

/** The request's unit caps: a map of unit name to a count (enforcer/context.py _units). */
function units(value: unknown): Map<string, number> | null {
  if (value === null || value === undefined) return null;
  if (typeof value !== "object" || Array.isArray(value)) throw new InvalidContext("units", "a map of unit name to count");
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length === 0) return null;
  if (entries.length > MAX_UNIT_CAPS) throw new InvalidContext("units", `more than ${MAX_UNIT_CAPS} units`);
  const out = new Map<string, number>();
  for (const [name, count] of entries) {
    if (!/^[a-z][a-z0-9_]{0,39}$/.test(name)) throw new InvalidContext("units", `${pyRepr(name)} is not a unit name`);
    if (typeof count !== "number" || !Number.isInteger(count) || count < 0 || count > MAX_UNITS_PER_EVENT) {
      throw new InvalidContext("units", `${name}: an integer in 0..${MAX_UNITS_PER_EVENT}`);
    }
    if (count) out.set(name, count);
  }
  return out.size > 0 ? out : null;
}

/** A validated context: the request as given and its canonical values. */
export class Context {
  readonly canon: Map<string, string[]>;
  readonly org: string;
  readonly secret: string;
  readonly user: string;
  readonly session: string;
  readonly group: string[];
  /** the billed units the request can cost at most (counts > 0), or null */
  readonly units: Map<string, number> | null;

  constructor(readonly request: RequestContext) {
    if (typeof request !== "object" || request === null || Array.isArray(request)) {
      throw new InvalidContext("<ctx>", "must be a JSON object");
    }
    for (const name of Object.keys(request)) {
      if (!FIELDS.has(name)) throw new InvalidContext(name, "not a context field");
    }
    this.org = required("org_id", request.org_id);
    this.secret = required("secret_id", request.secret_id);
    const groups = request.groups ?? [];
    if (!Array.isArray(groups)) throw new InvalidContext("groups", "must be a list of strings");
    if (groups.length > MAX_GROUPS) throw new InvalidContext("groups", `more than ${MAX_GROUPS} groups`);
    const group: string[] = [];
    for (const g of groups) {
      if (typeof g !== "string" || codePoints(g) > MAX_ID_LENGTH) {
        throw new InvalidContext("groups", `each group a string of <= ${MAX_ID_LENGTH}`);
      }
      const c = canonicalId(g);
      if (c && !group.includes(c)) group.push(c);
    }
    this.group = group;
    const optional = (name: keyof RequestContext): string[] => {
      const value = request[name];
      return value === null || value === undefined ? [] : id(name, value);
    };
    const users = optional("user_id");
    const sessions = optional("session_id");
    const canon = new Map<string, string[]>([
      ["org_id", [this.org]],
      ["secret_id", [this.secret]],
      ["project_id", optional("project_id")],
      ["grant_id", optional("grant_id")],
      ["permission_id", optional("permission_id")],
      ["user_id", users],
      ["session_id", sessions],
      ["provider", optional("provider")],
      ["api", optional("api")],
      ["model", optional("model")],
      ["group", group],
    ]);
    const tags = request.tags;
    if (tags !== null && tags !== undefined) {
      if (typeof tags !== "object" || Array.isArray(tags)) throw new InvalidContext("tags", "must be a map of string to string");
      const entries = Object.entries(tags);
      if (entries.length > MAX_TAGS) throw new InvalidContext("tags", `more than ${MAX_TAGS} tags`);
      for (const [name, value] of entries) {
        if (typeof value !== "string") throw new InvalidContext("tags", "must be a map of string to string");
        if (codePoints(name) > MAX_ID_LENGTH || codePoints(value) > MAX_ID_LENGTH) {
          throw new InvalidContext("tags", `keys and values of <= ${MAX_ID_LENGTH} characters`);
        }
        const c = canonicalId(value);
        canon.set(`tag:${name}`, c ? [c] : []);
      }
    }
    count("input_tokens", request.input_tokens, MAX_TOKENS_PER_EVENT);
    count("request_bytes", request.request_bytes, MAX_REQUEST_BYTES);
    count("max_output_tokens", request.max_output_tokens, MAX_TOKENS_PER_EVENT);
    const candidates = request.candidates;
    if (
      candidates !== null &&
      candidates !== undefined &&
      (typeof candidates !== "number" || !Number.isInteger(candidates) || candidates < 1 || candidates > MAX_CANDIDATES)
    ) {
      throw new InvalidContext("candidates", `must be an integer in [1, ${MAX_CANDIDATES}]`);
    }
    this.units = units(request.units);
    this.canon = canon;
    this.user = users[0] ?? "";
    this.session = sessions[0] ?? "";
  }
}
