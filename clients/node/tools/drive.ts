// A small Node service over the client, for tests/clients/test_node_client.py (and a
// usage example): one JSON object per line on stdout.
//
//   node dist/tools/drive.js publish  BOOTSTRAP PREFIX EVENTS.json
//     builds each event with newUsageEvent (ids assigned here), publishes them, then
//     publishes the first `resend` of them again (same ids); prints the events sent.
//   node dist/tools/drive.js check    BOOTSTRAP PREFIX REQUESTS.json [GENERATION]
//     follows the verdicts until ready, prints peek() of every request; with
//     GENERATION, then waits until the follower follows it and prints them again.
import * as fs from "node:fs";
import { Checker, UsageEventFields, UsagePublisher, VerdictFollower, newUsageEvent } from "../src";

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

async function publish(brokers: string[], prefix: string, file: string): Promise<void> {
  const spec = JSON.parse(fs.readFileSync(file, "utf8")) as { events: UsageEventFields[]; resend: number };
  const events = spec.events.map((fields) => newUsageEvent(fields));
  const publisher = new UsagePublisher({ brokers, topicPrefix: prefix, retries: Number.MAX_SAFE_INTEGER });
  await publisher.start();
  try {
    for (const event of events) await publisher.publish(event);
    await publisher.publishMany(events.slice(0, spec.resend));
  } finally {
    await publisher.stop();
  }
  print({ published: events });
}

function decide(checker: Checker, requests: Record<string, unknown>[]): unknown[] {
  // peeks: what check() would decide, holding nothing (the Python side peeks alike)
  return requests.map((request) => checker.peek(request as never).toJSON(true));
}

async function check(brokers: string[], prefix: string, file: string, generation?: string): Promise<void> {
  const requests = JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>[];
  const follower = new VerdictFollower({ brokers, topicPrefix: prefix, freshnessIntervalMs: 200 });
  await follower.start();
  try {
    if (!(await follower.waitReady(60_000))) throw new Error("the follower was not ready within 60 s");
    const checker = new Checker(follower.state);
    print({ generation: follower.generation, decisions: decide(checker, requests) });
    if (generation !== undefined) {
      const deadline = Date.now() + 60_000;
      while (follower.generation !== generation && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      print({ generation: follower.generation, decisions: decide(checker, requests) });
    }
  } finally {
    await follower.stop();
  }
}

async function main(argv: string[]): Promise<void> {
  const [command, bootstrap, prefix, file, generation] = argv;
  const brokers = (bootstrap ?? "").split(",").filter(Boolean);
  if (command === "publish" && file) return publish(brokers, prefix ?? "", file);
  if (command === "check" && file) return check(brokers, prefix ?? "", file, generation);
  throw new Error("usage: drive.js publish|check BOOTSTRAP PREFIX FILE [GENERATION]");
}

main(process.argv.slice(2)).then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(1);
  },
);
