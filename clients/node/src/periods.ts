/**
 * Budget windows and their period keys (schemas/periods.py): day, week and month
 * windows follow the budget's calendar (an IANA zone, a week start, a month start day);
 * `total` has one period. Rolling windows are parsed but not checked by this client.
 */
export type WindowKind = "day" | "week" | "month" | "total" | "rolling";

export interface Window {
  kind: WindowKind;
  /** rolling windows: the duration in µs */
  rollingUs: number;
  timezone: string;
  /** 0 = Monday ... 6 = Sunday */
  weekStart: number;
  monthStartDay: number;
  /** "day", "week", "month", "total" or "rolling:<n><unit>" */
  spec: string;
}

export const WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"];
const UNIT_SECONDS: Record<string, number> = { m: 60, h: 3600, d: 86400, w: 7 * 86400 };

export function parseWindow(
  text: string,
  timezone = "UTC",
  weekStart = "monday",
  monthStartDay = 1,
): Window {
  const spec = text.trim();
  const calendar = {
    timezone: timezone.trim() || "UTC",
    weekStart: Math.max(0, WEEKDAYS.indexOf(weekStart.trim().toLowerCase() || "monday")),
    monthStartDay,
  };
  if (spec === "day" || spec === "week" || spec === "month" || spec === "total") {
    return { kind: spec, rollingUs: 0, spec, ...calendar };
  }
  const match = /^rolling:(\d+)([mhdw])$/.exec(spec);
  if (!match || Number(match[1]) === 0) {
    throw new Error(`window ${JSON.stringify(spec)}: expected day, week, month, total or rolling:<n><m|h|d|w>`);
  }
  const seconds = Number(match[1]) * UNIT_SECONDS[match[2]];
  return { kind: "rolling", rollingUs: seconds * 1_000_000, spec, ...calendar };
}

/** A calendar date (proleptic Gregorian), months 1-12. */
interface Day {
  year: number;
  month: number;
  day: number;
}

const DAY_MS = 86_400_000;
/** a UTC day in µs (the period of the bound on new session ids per key) */
export const DAY_US = 86_400_000_000;

function dayFromEpochDays(days: number): Day {
  const d = new Date(days * DAY_MS);
  return { year: d.getUTCFullYear(), month: d.getUTCMonth() + 1, day: d.getUTCDate() };
}

function epochDays(day: Day): number {
  return Math.floor(Date.UTC(day.year, day.month - 1, day.day) / DAY_MS);
}

const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(zone: string): Intl.DateTimeFormat {
  let f = formatters.get(zone);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone,
      hourCycle: "h23",
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
    });
    formatters.set(zone, f);
  }
  return f;
}

/** The wall-clock time in `zone` at `ms` (UTC), as if it were UTC, in ms. */
function wallMs(zone: string, ms: number): number {
  const parts: Record<string, number> = {};
  for (const p of formatter(zone).formatToParts(new Date(ms))) {
    if (p.type !== "literal") parts[p.type] = Number(p.value);
  }
  return Date.UTC(parts.year, parts.month - 1, parts.day, parts.hour, parts.minute, parts.second);
}

function offsetMs(zone: string, ms: number): number {
  const whole = Math.floor(ms / 1000) * 1000;
  return wallMs(zone, whole) - whole;
}

/** The local date at `us` in the window's zone. */
function localDay(window: Window, us: number): Day {
  const ms = Math.floor(us / 1000);
  const local = window.timezone === "UTC" ? ms : ms + offsetMs(window.timezone, ms);
  return dayFromEpochDays(Math.floor(local / DAY_MS));
}

/** The first instant (µs, UTC) of local `day`: Python's fold=0 (an ambiguous midnight is
 * its first occurrence; a skipped one maps to the moment the clocks jump). */
function midnightUs(window: Window, day: Day): number {
  const naive = Date.UTC(day.year, day.month - 1, day.day);
  if (window.timezone === "UTC") return naive * 1000;
  const zone = window.timezone;
  const offsets = new Set<number>();
  for (const probe of [naive - DAY_MS, naive, naive + DAY_MS]) offsets.add(offsetMs(zone, probe));
  for (const o of [...offsets]) offsets.add(offsetMs(zone, naive - o));
  const candidates = [...offsets].map((o) => naive - o);
  const valid = candidates.filter((t) => offsetMs(zone, t) === naive - t);
  const chosen = valid.length > 0 ? Math.min(...valid) : Math.max(...candidates);
  return chosen * 1000;
}

function addMonths(day: Day, months: number): Day {
  const index = day.year * 12 + day.month - 1 + months;
  return { year: Math.floor(index / 12), month: (index % 12) + 1, day: day.day };
}

function firstDay(window: Window, us: number): Day | null {
  const kind = window.kind;
  if (kind !== "day" && kind !== "week" && kind !== "month") return null;
  const today = localDay(window, us);
  if (kind === "day") return today;
  if (kind === "week") {
    const days = epochDays(today);
    const weekday = (((days + 3) % 7) + 7) % 7; // 1970-01-01 was a Thursday (3)
    return dayFromEpochDays(days - ((((weekday - window.weekStart) % 7) + 7) % 7));
  }
  const cycle = { ...today, day: window.monthStartDay };
  return today.day >= window.monthStartDay ? cycle : addMonths(cycle, -1);
}

function nextFirstDay(window: Window, first: Day): Day {
  if (window.kind === "day") return dayFromEpochDays(epochDays(first) + 1);
  if (window.kind === "week") return dayFromEpochDays(epochDays(first) + 7);
  return addMonths(first, 1);
}

const pad = (n: number, width: number): string => String(n).padStart(width, "0");

/** ISO year and week of `day`. */
function isoWeek(day: Day): [number, number] {
  const days = epochDays(day);
  const weekday = (((days + 3) % 7) + 7) % 7; // Monday = 0
  const thursday = dayFromEpochDays(days - weekday + 3);
  const jan1 = epochDays({ year: thursday.year, month: 1, day: 1 });
  return [thursday.year, Math.floor((epochDays(thursday) - jan1) / 7) + 1];
}

function formatDuration(us: number): string {
  const seconds = Math.floor(us / 1_000_000);
  for (const unit of ["w", "d", "h", "m"]) {
    if (seconds % UNIT_SECONDS[unit] === 0) return `${seconds / UNIT_SECONDS[unit]}${unit}`;
  }
  throw new Error("rolling windows are whole minutes");
}

/** The key of the period `us` falls in. */
export function periodKey(window: Window, us: number): string {
  if (window.kind === "total") return "t";
  const first = firstDay(window, us);
  if (first === null) return `r:${formatDuration(window.rollingUs)}`;
  if (window.kind === "month") return `m:${pad(first.year, 4)}-${pad(first.month, 2)}`;
  if (window.kind === "day") return `d:${pad(first.year, 4)}-${pad(first.month, 2)}-${pad(first.day, 2)}`;
  const [year, week] = isoWeek(dayFromEpochDays(epochDays(first) + 3));
  return `w:${pad(year, 4)}-W${pad(week, 2)}`;
}

/** When the period containing `us` ends (µs, UTC); null when it never resets. */
export function periodEndUs(window: Window, us: number): number | null {
  const first = firstDay(window, us);
  return first === null ? null : midnightUs(window, nextFirstDay(window, first));
}

/** `us` as Python's isoformat of a UTC datetime, with `Z` (microseconds when not 0). */
export function isoUs(us: number | null): string | null {
  if (us === null) return null;
  const ms = Math.floor(us / 1000);
  const micros = us - Math.floor(us / 1_000_000) * 1_000_000;
  const base = new Date(ms).toISOString().slice(0, 19);
  return micros === 0 ? `${base}Z` : `${base}.${pad(micros, 6)}Z`;
}
