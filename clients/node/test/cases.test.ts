// The shared table (test/cases.json, written from the Python enforcer and codec by
// tests/clients/node_cases.py): every check decided as Python decides it, every event
// encoded and keyed as the Python publisher writes it.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { Partitioners } from "kafkajs";
import {
  Checker,
  codecFor,
  Context,
  FollowerState,
  InvalidContext,
  prepare,
  UsageEvent,
} from "../src";

interface CheckCase {
  name: string;
  applied_at_us: number;
  checked_at_us: number;
  ready: boolean;
  fresh_at_us: number | null;
  config: Record<string, unknown>;
  prices: [string, string][];
  policies: [string, string][];
  raises: [string, string][];
  verdicts: [string, string][];
  before: Record<string, unknown>[];
  settled: [number, UsageEvent][];
  verdicts_after: [string, string][];
  ctx: Record<string, unknown>;
  expected: Record<string, unknown>;
}

const table = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "test", "cases.json"), "utf8"));

function decideInNode(c: CheckCase): Record<string, unknown> {
  let now = c.applied_at_us;
  const state = new FollowerState(() => now);
  for (const [key, hex] of c.prices) state.applyPrice(key, codecFor("PriceTable").decode(Buffer.from(hex, "hex")));
  for (const [key, hex] of c.policies) state.applyPolicy(key, codecFor("BudgetPolicy").decode(Buffer.from(hex, "hex")));
  for (const [key, hex] of c.raises) state.applyRaise(key, codecFor("BudgetRaise").decode(Buffer.from(hex, "hex")));
  for (const [key, hex] of c.verdicts) state.applyVerdict(key, codecFor("Verdict").decode(Buffer.from(hex, "hex")));
  state.ready = c.ready;
  state.freshAtUs = c.fresh_at_us;
  now = c.checked_at_us;
  const checker = new Checker(state, c.config);
  const decisions = c.before.map((earlier) => checker.check(earlier as never));
  for (const [i, event] of c.settled) assert.ok(checker.settle(decisions[i], event), `settle ${i}`);
  for (const [key, hex] of c.verdicts_after) state.applyVerdict(key, codecFor("Verdict").decode(Buffer.from(hex, "hex")));
  let ctx: Context;
  try {
    ctx = new Context(c.ctx as never);
  } catch (error) {
    if (error instanceof InvalidContext) return { invalid_context: error.field };
    throw error;
  }
  const decision = checker.peek(ctx);
  const answer = decision.toJSON(true);
  answer.refusal_event = decision.refusalEvent("node", { event_id: "refused" });
  return JSON.parse(JSON.stringify(answer));
}

for (const c of table.checks as CheckCase[]) {
  test(`check: ${c.name}`, () => {
    assert.deepEqual(decideInNode(c), c.expected);
  });
}

test("the codec's fingerprints are the Python codec's", () => {
  for (const [name, hex] of Object.entries(table.fingerprints as Record<string, string>)) {
    assert.equal(codecFor(name as never).header.subarray(2).toString("hex"), hex, name);
  }
});

test("events are keyed, partitioned and encoded as the Python publisher writes them", () => {
  const partitioner = Partitioners.DefaultPartitioner();
  const metadata = (n: number) => Array.from({ length: n }, (_, partitionId) => ({ partitionId, leader: 0 }));
  for (const e of table.events) {
    const prepared = prepare(e.event as UsageEvent);
    assert.equal(prepared.key.toString("hex"), e.key_hex);
    assert.equal(prepared.value.toString("hex"), e.value_hex);
    for (const [n, expected] of [
      [4, e.partition_of_4],
      [12, e.partition_of_12],
    ]) {
      const partition = partitioner({
        topic: "usage.raw",
        partitionMetadata: metadata(n) as never,
        message: { key: prepared.key, value: prepared.value },
      });
      assert.equal(partition, expected, `${e.event.org_id} of ${n}`);
    }
    // and what Python wrote decodes back to the same event
    assert.deepEqual({ ...codecFor("UsageEvent").decode(Buffer.from(e.value_hex, "hex")) }, e.event);
  }
});

test("records of every released schema version read as the Python codec reads them", () => {
  assert.ok(table.released_versions.length > 0);
  for (const r of table.released_versions) {
    const decoded = codecFor(r.name).decode(Buffer.from(r.value_hex, "hex"));
    assert.deepEqual(JSON.parse(JSON.stringify(decoded)), r.decoded, `${r.name} v${r.version}`);
  }
});
