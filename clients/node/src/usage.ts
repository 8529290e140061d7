/**
 * UsageEvents as the contract defines them (schemas/usage.py): a complete event with the
 * defaults of new_usage_event, a time-ordered event id assigned once, and the checks
 * validate_usage_event makes (an InvalidEvent names the first field at fault).
 */
import { randomBytes } from "node:crypto";
import { codePoints, MAX_ID_LENGTH, strip } from "./ids";

export const MAX_TOKENS_PER_EVENT = 100_000_000;
export const MAX_UNITS_PER_EVENT = 100_000_000;
const MIN_OCCURRED_AT_US = Date.UTC(2000, 0, 1) * 1000;
const MAX_OCCURRED_AT_US = Date.UTC(2100, 0, 1) * 1000;
const REQUIRED_IDS = ["event_id", "provider", "api", "model", "secret_id", "org_id", "gateway_id"] as const;
const OPTIONAL_IDS = ["project_id", "grant_id", "permission_id", "user_id", "session_id"] as const;
const TOKEN_FIELDS = [
  "input_tokens",
  "cache_read_tokens",
  "cache_write_tokens",
  "cache_write_1h_tokens",
  "output_tokens",
  "reasoning_tokens",
] as const;
export const USAGE_SOURCES = ["reported", "estimated", "none"];
export const OUTCOMES = ["allowed", "refused", "failed_open", "failed_closed"];

/** One UsageEvent record (the fields of schemas/avro/standalone/UsageEvent.avsc). */
export interface UsageEvent {
  event_id: string;
  /** microseconds since the epoch, UTC */
  occurred_at: number;
  provider: string;
  api: string;
  model: string;
  secret_id: string;
  org_id: string;
  project_id: string | null;
  grant_id: string | null;
  permission_id: string | null;
  user_id: string | null;
  groups: string[];
  session_id: string | null;
  tags: Record<string, string>;
  input_tokens: number;
  cache_read_tokens: number;
  cache_write_tokens: number;
  cache_write_1h_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  usage_source: string;
  estimate_reason: string | null;
  outcome: string;
  decision: string;
  decision_budget_id: string | null;
  status_code: number;
  stream: boolean;
  gateway_id: string;
  request_id: string | null;
  latency_ms: number | null;
  units: Record<string, number>;
  service_tier: string | null;
  charge_of: string | null;
}

/** The fields a caller gives; `occurred_at` may be a Date or µs since the epoch. */
export type UsageEventFields = Pick<
  UsageEvent,
  "provider" | "api" | "model" | "secret_id" | "org_id" | "gateway_id" | "input_tokens" | "output_tokens"
> &
  Partial<Omit<UsageEvent, "occurred_at">> & { occurred_at?: Date | number };

/** An event field that breaks the contract. */
export class InvalidEvent extends Error {
  constructor(
    readonly field: string,
    readonly problem: string,
    readonly eventId: string | null,
  ) {
    super(`${field}: ${problem}${eventId ? ` (event ${JSON.stringify(eventId)})` : ""}`);
    this.name = "InvalidEvent";
  }
}

/** A time-ordered unique id, the UUIDv7 layout of schemas.usage.new_event_id. */
export function newEventId(nowMs: number = Date.now()): string {
  const bytes = randomBytes(16);
  bytes.writeUIntBE(nowMs, 0, 6);
  bytes[6] = 0x70 | (bytes[6] & 0x0f);
  bytes[8] = 0x80 | (bytes[8] & 0x3f);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A complete, validated UsageEvent: the defaults of new_usage_event, an event id assigned
 * now (kept across every retry of its publication), occurred_at now unless given. */
export function newUsageEvent(fields: UsageEventFields): UsageEvent {
  const { occurred_at, ...rest } = fields;
  const occurredUs =
    occurred_at === undefined ? Date.now() * 1000 : occurred_at instanceof Date ? occurred_at.getTime() * 1000 : occurred_at;
  const event: UsageEvent = {
    event_id: fields.event_id || newEventId(),
    occurred_at: occurredUs,
    project_id: null,
    grant_id: null,
    permission_id: null,
    user_id: null,
    groups: [],
    session_id: null,
    tags: {},
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    cache_write_1h_tokens: 0,
    reasoning_tokens: 0,
    usage_source: "reported",
    estimate_reason: null,
    outcome: "allowed",
    decision: "allowed",
    decision_budget_id: null,
    status_code: 200,
    stream: false,
    request_id: null,
    latency_ms: null,
    units: {},
    service_tier: null,
    charge_of: null,
    ...rest,
  } as UsageEvent;
  event.event_id = event.event_id || newEventId();
  validateUsageEvent(event);
  return event;
}

const PRINTABLE = /^[^\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]*$/u;

function isPrintable(value: string): boolean {
  // Python's str.isprintable(): no "Other" or separator character but the plain space
  return PRINTABLE.test(value.replace(/ /g, ""));
}

/** Throw InvalidEvent naming the first field of `event` that breaks the contract. */
export function validateUsageEvent(event: UsageEvent): void {
  const record = event as unknown as Record<string, unknown>;
  const eventId = typeof event.event_id === "string" ? event.event_id : null;
  for (const name of REQUIRED_IDS) {
    const value = record[name];
    if (typeof value !== "string" || !strip(value)) throw new InvalidEvent(name, "required, a non-empty string", eventId);
    if (codePoints(value) > MAX_ID_LENGTH) throw new InvalidEvent(name, `longer than ${MAX_ID_LENGTH} characters`, eventId);
  }
  if (!isPrintable(event.event_id)) throw new InvalidEvent("event_id", "must be printable text", null);
  for (const name of OPTIONAL_IDS) {
    const value = record[name];
    if (value !== null && (typeof value !== "string" || codePoints(value) > MAX_ID_LENGTH)) {
      throw new InvalidEvent(name, `must be null or a string of <= ${MAX_ID_LENGTH} characters`, eventId);
    }
  }
  for (const name of TOKEN_FIELDS) {
    const value = record[name];
    if (typeof value !== "number" || !Number.isInteger(value)) {
      throw new InvalidEvent(name, `must be an integer, got ${JSON.stringify(value)}`, eventId);
    }
    if (value < 0) throw new InvalidEvent(name, `must be >= 0, got ${value}`, eventId);
    if (value > MAX_TOKENS_PER_EVENT) {
      throw new InvalidEvent(name, `${value} exceeds the sanity bound ${MAX_TOKENS_PER_EVENT}`, eventId);
    }
  }
  if (event.cache_write_1h_tokens > event.cache_write_tokens) {
    throw new InvalidEvent("cache_write_1h_tokens", "is a part of cache_write_tokens: cannot exceed it", eventId);
  }
  if (event.reasoning_tokens > event.output_tokens) {
    throw new InvalidEvent("reasoning_tokens", "is a part of output_tokens: cannot exceed it", eventId);
  }
  const at = event.occurred_at;
  if (typeof at !== "number" || !Number.isSafeInteger(at)) {
    throw new InvalidEvent("occurred_at", "must be a UTC timestamp (µs since the epoch)", eventId);
  }
  if (at < MIN_OCCURRED_AT_US || at >= MAX_OCCURRED_AT_US) {
    throw new InvalidEvent("occurred_at", `${at} µs is out of range (2000-2100)`, eventId);
  }
  if (!USAGE_SOURCES.includes(event.usage_source)) throw new InvalidEvent("usage_source", `one of ${USAGE_SOURCES}`, eventId);
  if (!OUTCOMES.includes(event.outcome)) throw new InvalidEvent("outcome", `one of ${OUTCOMES}`, eventId);
  const status = event.status_code;
  if (typeof status !== "number" || !Number.isInteger(status) || status < 100 || status > 599) {
    throw new InvalidEvent("status_code", `an HTTP status 100..599, got ${JSON.stringify(status)}`, eventId);
  }
  if (!Array.isArray(event.groups) || !event.groups.every((g) => typeof g === "string")) {
    throw new InvalidEvent("groups", "must be a list of strings", eventId);
  }
  const tags = event.tags;
  if (typeof tags !== "object" || tags === null || !Object.values(tags).every((v) => typeof v === "string")) {
    throw new InvalidEvent("tags", "must be a map of string to string", eventId);
  }
  const tier = event.service_tier;
  if (tier !== null && (typeof tier !== "string" || !/^[a-z][a-z0-9_-]{0,31}$/.test(tier))) {
    throw new InvalidEvent("service_tier", `null or a short lower-case word, got ${JSON.stringify(tier)}`, eventId);
  }
  for (const [name, count] of Object.entries(event.units ?? {})) {
    if (!/^[a-z][a-z0-9_]{0,39}$/.test(name)) {
      throw new InvalidEvent("units", `unit name ${JSON.stringify(name)} is not [a-z][a-z0-9_]* (at most 40 characters)`, eventId);
    }
    if (typeof count !== "number" || !Number.isInteger(count) || count < 0 || count > MAX_UNITS_PER_EVENT) {
      throw new InvalidEvent("units", `${name}: a count 0..${MAX_UNITS_PER_EVENT}, got ${JSON.stringify(count)}`, eventId);
    }
  }
}
