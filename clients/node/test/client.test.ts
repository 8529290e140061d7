// What the shared table cannot show: the client's own behaviour over several calls (rates
// given back by settle and release), and the errors bad input gets.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { Checker, codecFor, FollowerState, InvalidEvent, newEventId, newUsageEvent, prepare } from "../src";

const NOW_US = Date.UTC(2026, 10, 30, 12) * 1000;

function rated(): Checker {
  const state = new FollowerState(() => NOW_US);
  state.applyPolicy("rated", {
    budget_id: "rated",
    scope: "org",
    match: {},
    window: "total",
    limit_nanos: null,
    limit_tokens: null,
    limit_requests: null,
    action: "enforce",
    alert_at: [],
    count_denied: false,
    rate: { requests_per_second: 2, requests_per_minute: null, tokens_per_second: null, tokens_per_minute: 6000 },
    timezone: "UTC",
    week_start: "monday",
    month_start_day: 1,
    unpriced: null,
    applied_at: NOW_US,
  });
  state.ready = true;
  state.freshAtUs = NOW_US;
  return new Checker(state);
}

const request = { org_id: "acme", secret_id: "sk-1", input_tokens: 1, max_output_tokens: 1 };
const usage = {
  provider: "anthropic",
  api: "anthropic-messages",
  model: "claude-sonnet-4-5",
  secret_id: "sk-1",
  org_id: "acme",
  gateway_id: "node",
  input_tokens: 1,
  output_tokens: 1,
};

test("release gives an admitted request's rate back, settle its unused tokens", () => {
  const checker = rated();
  const first = checker.check(request);
  const second = checker.check(request);
  assert.ok(first.allowed && second.allowed);
  assert.equal(checker.check(request).decision, "throttled");
  checker.release(second);
  assert.ok(checker.check(request).allowed);

  const tokens = rated();
  const big = tokens.check({ ...request, input_tokens: 3000, max_output_tokens: 3000 });
  assert.ok(big.allowed);
  tokens.release(tokens.check(request)); // the request bucket keeps room: only tokens in debt
  assert.equal(tokens.check(request).throttle?.[0], true);
  // it used 10 tokens: the 5,990 beyond them come back
  tokens.settle(big, newUsageEvent({ ...usage, input_tokens: 4, output_tokens: 6 }));
  assert.ok(tokens.check(request).allowed);
});

test("a bad event is refused naming its field, before anything is encoded", () => {
  const fields = {
    provider: "anthropic",
    api: "anthropic-messages",
    model: "claude-sonnet-4-5",
    secret_id: "sk-1",
    org_id: " Acme ",
    gateway_id: "node",
    input_tokens: 10,
    output_tokens: 5,
  };
  const cases: [Record<string, unknown>, string][] = [
    [{ org_id: "  " }, "org_id"],
    [{ input_tokens: -1 }, "input_tokens"],
    [{ output_tokens: 1.5 }, "output_tokens"],
    [{ reasoning_tokens: 6 }, "reasoning_tokens"],
    [{ cache_write_1h_tokens: 1 }, "cache_write_1h_tokens"],
    [{ event_id: "a\nb" }, "event_id"],
    [{ occurred_at: new Date("1999-12-31T23:59:59Z") }, "occurred_at"],
    [{ status_code: 700 }, "status_code"],
    [{ usage_source: "guessed" }, "usage_source"],
    [{ units: { WebSearch: 1 } }, "units"],
    [{ service_tier: "Priority!" }, "service_tier"],
  ];
  for (const [bad, field] of cases) {
    assert.throws(
      () => newUsageEvent({ ...fields, ...bad } as never),
      (error: unknown) => error instanceof InvalidEvent && error.field === field,
      field,
    );
  }
  const event = newUsageEvent(fields);
  assert.equal(prepare(event).key.toString("utf8"), "Acme");
  assert.throws(() => prepare({ ...event, tags: { team: 7 } } as never), InvalidEvent);
  assert.throws(() => codecFor("UsageEvent").encode({ ...event, stream: "yes" }), /stream/);
});

test("event ids are UUIDv7, one per event, kept once assigned", () => {
  const id = newEventId(Date.UTC(2026, 0, 1));
  assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(parseInt(id.replace(/-/g, "").slice(0, 12), 16), Date.UTC(2026, 0, 1));
  assert.notEqual(newEventId(), newEventId());
  const fields = {
    provider: "p",
    api: "a",
    model: "m",
    secret_id: "s",
    org_id: "o",
    gateway_id: "g",
    input_tokens: 1,
    output_tokens: 1,
  };
  assert.equal(newUsageEvent({ ...fields, event_id: "mine" }).event_id, "mine");
});
