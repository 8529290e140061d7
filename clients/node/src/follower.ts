/**
 * The verdict follower (enforcer/follower.py, docs/contract.md "Following the verdicts"):
 * budget.policies, budget.raises, pricing and spendbus.generations, and the verdict topic of the
 * current generation, each read whole from the beginning (compacted topics: the newest
 * value per key), into a FollowerState that check() reads.
 *
 * Ready once every partition reached the end offset seen at start. Fresh: every few
 * seconds the end offsets of the verdict topic are read, and once the follower's
 * positions reach them the verdicts are known current as of that read; check() fails
 * open or closed (fail_mode) when that is older than `grace`.
 *
 * A generation switch (`spendbus replay --cutover`): the new generation's verdict topic
 * is read to the end offsets seen when the switch arrived while checks keep reading the
 * old verdicts; then, in one synchronous step, every loaded verdict is applied to what is
 * held by the period rule (per counter the newer stays) and only the new topic is
 * followed from then on.
 */
import { randomUUID } from "node:crypto";
import { Admin, Consumer, EachBatchPayload, Kafka, KafkaConfig, logLevel } from "kafkajs";
import { codecFor, SchemaName } from "./avro";
import { FollowerState } from "./state";

export interface FollowerOptions {
  brokers: string[];
  topicPrefix?: string;
  clientId?: string;
  /** how often (ms) the end offsets are read for freshness */
  freshnessIntervalMs?: number;
  kafka?: Omit<KafkaConfig, "brokers" | "clientId">;
  /** a record the follower could not use (bad framing, an unknown schema, a value past
   * 2^53...): it is skipped, as the Python follower skips it; by default a warning says so */
  onSkipped?: (topic: string, partition: number, offset: string, error: unknown) => void;
}

type Apply = (key: string, record: Record<string, unknown> | null) => void;

/** One topic read from its beginning by a consumer of a group of its own (nothing committed). */
class TopicReader {
  readonly positions = new Map<number, bigint>();
  startEnds = new Map<number, bigint>();
  private consumer: Consumer | null = null;

  constructor(
    private readonly kafka: Kafka,
    private readonly admin: Admin,
    readonly topic: string,
    private readonly schema: SchemaName,
    private apply: Apply,
    private readonly onSkipped: FollowerOptions["onSkipped"],
  ) {}

  setApply(apply: Apply): void {
    this.apply = apply;
  }

  async start(): Promise<void> {
    this.startEnds = await this.ends();
    for (const [partition] of this.startEnds) if (!this.positions.has(partition)) this.positions.set(partition, 0n);
    const consumer = this.kafka.consumer({
      groupId: `spendbus-node-follower-${randomUUID()}`,
      sessionTimeout: 30_000,
      allowAutoTopicCreation: false,
    });
    this.consumer = consumer;
    await consumer.connect();
    await consumer.subscribe({ topic: this.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatch: async (payload: EachBatchPayload) => this.onBatch(payload),
    });
  }

  private async onBatch({ batch, resolveOffset, heartbeat }: EachBatchPayload): Promise<void> {
    const codec = codecFor(this.schema);
    for (const message of batch.messages) {
      try {
        if (message.key === null) throw new Error("a record without a key");
        const record = message.value === null ? null : codec.decode(message.value);
        this.apply(message.key.toString("utf8"), record);
      } catch (error) {
        this.onSkipped?.(batch.topic, batch.partition, message.offset, error);
      }
      this.positions.set(batch.partition, BigInt(message.offset) + 1n);
      resolveOffset(message.offset);
    }
    await heartbeat();
  }

  /** The end offset of every partition now. */
  async ends(): Promise<Map<number, bigint>> {
    const offsets = await this.admin.fetchTopicOffsets(this.topic);
    return new Map(offsets.map((o) => [o.partition, BigInt(o.high)]));
  }

  /** Every partition's position reached `ends` (a partition empty from its start counts). */
  reached(ends: Map<number, bigint>): boolean {
    for (const [partition, end] of ends) {
      if ((this.positions.get(partition) ?? 0n) < end) return false;
    }
    return true;
  }

  /** Compacted partitions may start past 0: a position is at least the low watermark. */
  async skipToLow(): Promise<void> {
    const offsets = await this.admin.fetchTopicOffsets(this.topic);
    for (const o of offsets) {
      const low = BigInt(o.low);
      if ((this.positions.get(o.partition) ?? 0n) < low) this.positions.set(o.partition, low);
    }
  }

  async stop(): Promise<void> {
    await this.consumer?.disconnect();
    this.consumer = null;
  }
}

export class VerdictFollower {
  readonly state: FollowerState;
  /** the generation whose verdicts are followed ("" = the default one) */
  generation = "";
  switches = 0;
  private readonly kafka: Kafka;
  private admin: Admin | null = null;
  private readonly prefix: string;
  private readers: TopicReader[] = [];
  private verdicts: TopicReader | null = null;
  private loading: { reader: TopicReader; generation: string; records: [string, Record<string, unknown> | null][] } | null =
    null;
  private timer: NodeJS.Timeout | null = null;
  private wanted = "";
  private readyWaiters: (() => void)[] = [];

  private readonly options: FollowerOptions;

  constructor(options: FollowerOptions, state?: FollowerState) {
    this.options = {
      onSkipped: (topic, partition, offset, error) =>
        process.emitWarning(`skipped ${topic}@${partition}/${offset}: ${error instanceof Error ? error.message : String(error)}`),
      ...options,
    };
    this.state = state ?? new FollowerState();
    this.prefix = options.topicPrefix ?? "";
    this.kafka = new Kafka({
      logLevel: logLevel.WARN,
      ...options.kafka,
      brokers: options.brokers,
      clientId: options.clientId ?? "spendbus-node-follower",
    });
  }

  /** budget.verdicts of `generation` (with the prefix), as schemas/topics.py names it. */
  verdictTopic(generation: string): string {
    return generation ? `${this.prefix}budget.verdicts.${generation}` : `${this.prefix}budget.verdicts`;
  }

  private reader(topic: string, schema: SchemaName, apply: Apply): TopicReader {
    return new TopicReader(this.kafka, this.admin!, topic, schema, apply, this.options.onSkipped);
  }

  async start(): Promise<void> {
    this.admin = this.kafka.admin();
    await this.admin.connect();
    const existing = new Set(await this.admin.listTopics());
    const state = this.state;
    const generations = `${this.prefix}spendbus.generations`;
    if (existing.has(generations)) {
      // which generation to follow: the control topic read to its end first
      const control = this.reader(generations, "GenerationSwitch", (key, record) => this.onSwitch(key, record));
      this.readers.push(control);
      await control.start();
      await control.skipToLow();
      await this.until(() => control.reached(control.startEnds));
      this.generation = this.wanted;
    }
    const needed = [
      `${this.prefix}budget.policies`,
      `${this.prefix}budget.raises`,
      `${this.prefix}pricing`,
      this.verdictTopic(this.generation),
    ];
    const missing = needed.filter((topic) => !existing.has(topic));
    if (missing.length > 0) {
      await this.admin.disconnect();
      throw new Error(
        `the topics ${missing.join(", ")} do not exist on ${this.options.brokers.join(",")}: ` +
          "create the contract's topics (spendbus topics check) or check SPENDBUS_TOPIC_PREFIX",
      );
    }
    this.readers.push(
      this.reader(`${this.prefix}budget.policies`, "BudgetPolicy", (k, r) => state.applyPolicy(k, r)),
      this.reader(`${this.prefix}budget.raises`, "BudgetRaise", (k, r) => state.applyRaise(k, r)),
      this.reader(`${this.prefix}pricing`, "PriceTable", (k, r) => state.applyPrice(k, r)),
    );
    this.verdicts = this.reader(this.verdictTopic(this.generation), "Verdict", (k, r) => {
      state.applyVerdict(k, r);
    });
    const started = [...this.readers.slice(-3), this.verdicts];
    for (const reader of started) {
      await reader.start();
      await reader.skipToLow();
    }
    this.timer = setInterval(() => void this.tick(), this.options.freshnessIntervalMs ?? 1_000);
    await this.tick();
  }

  private onSwitch(key: string, record: Record<string, unknown> | null): void {
    if (key !== "current") return;
    this.wanted = record === null ? "" : (record.generation as string);
  }

  /** Readiness, freshness and a pending generation switch, once per interval. */
  private async tick(): Promise<void> {
    try {
      const verdicts = this.verdicts;
      if (verdicts === null) return;
      const all = [...this.readers, verdicts];
      if (!this.state.ready && all.every((r) => r.reached(r.startEnds))) {
        this.state.ready = true;
        this.state.freshAtUs = this.state.clockUs();
        for (const wake of this.readyWaiters.splice(0)) wake();
      }
      if (this.state.ready) {
        const readAt = this.state.clockUs();
        if (verdicts.reached(await verdicts.ends())) {
          if (this.state.freshAtUs === null || readAt > this.state.freshAtUs) this.state.freshAtUs = readAt;
        }
      }
      await this.followSwitch();
    } catch {
      // a broker away for a moment: the verdicts go stale and fail_mode decides meanwhile
    }
  }

  private async followSwitch(): Promise<void> {
    const wanted = this.wanted;
    if (this.loading === null) {
      if (wanted === this.generation || !this.state.ready) return;
      const records: [string, Record<string, unknown> | null][] = [];
      const reader = this.reader(this.verdictTopic(wanted), "Verdict", (k, r) => {
        records.push([k, r]);
      });
      try {
        // the new generation's topics are created before the switch; until then, wait
        await reader.start();
        await reader.skipToLow();
      } catch (error) {
        await reader.stop();
        throw error;
      }
      this.loading = { reader, generation: wanted, records };
      return;
    }
    const loading = this.loading;
    if (!loading.reader.reached(loading.reader.startEnds)) return;
    // --- from here to the end: synchronous, so no check sees a half-swapped state ---
    for (const [key, record] of loading.records) {
      if (record === null) continue; // a swap never drops a counter
      try {
        this.state.applyVerdict(key, record);
      } catch (error) {
        this.options.onSkipped?.(loading.reader.topic, -1, "-1", error);
      }
    }
    loading.reader.setApply((k, r) => {
      this.state.applyVerdict(k, r);
    });
    const old = this.verdicts!;
    old.setApply(() => undefined);
    this.verdicts = loading.reader;
    this.generation = loading.generation;
    this.loading = null;
    this.switches++;
    await old.stop();
  }

  private async until(done: () => boolean): Promise<void> {
    while (!done()) await new Promise((wake) => setTimeout(wake, 50));
  }

  /** Resolves true once ready, false at the timeout. */
  async waitReady(timeoutMs: number): Promise<boolean> {
    if (this.state.ready) return true;
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), timeoutMs);
      this.readyWaiters.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }

  async stop(): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    for (const reader of [...this.readers, this.verdicts, this.loading?.reader]) await reader?.stop();
    await this.admin?.disconnect();
  }
}
