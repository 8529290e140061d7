/**
 * The publisher: one UsageEvent per upstream call to usage.raw, as the Python publisher
 * writes it (ingest/publisher/, docs/contract.md "Publishing to Kafka"):
 *
 * - the key is the UTF-8 of the event's canonical org_id (schemas.topics.usage_raw_key);
 * - the partition is Kafka's murmur2 of the key, as the Java producer picks it
 *   (KafkaJS's DefaultPartitioner);
 * - the value is the Avro single-object encoding of the current UsageEvent schema;
 * - the producer is idempotent with acks=all and at most 5 requests in flight, and
 *   retries: a batch retried after a lost acknowledgement is written once, and a
 *   record sent again carries the same event_id, which the aggregator counts once.
 */
import { Kafka, KafkaConfig, Partitioners, Producer } from "kafkajs";
import { codecFor } from "./avro";
import { usageRawKey } from "./ids";
import { UsageEvent, validateUsageEvent } from "./usage";

export interface PublisherOptions {
  /** bootstrap servers, e.g. ["127.0.0.1:9092"] */
  brokers: string[];
  /** SPENDBUS_TOPIC_PREFIX */
  topicPrefix?: string;
  clientId?: string;
  /** retries of one send before publish() throws (KafkaJS's retry: exponential back-off) */
  retries?: number;
  /** more KafkaJS client settings (ssl, sasl...) */
  kafka?: Omit<KafkaConfig, "brokers" | "clientId">;
}

/** A prepared record: its key and value bytes, and its event id. */
export interface PreparedEvent {
  eventId: string;
  key: Buffer;
  value: Buffer;
}

/** The usage.raw record of `event`, validated (InvalidEvent names the field at fault). */
export function prepare(event: UsageEvent): PreparedEvent {
  validateUsageEvent(event);
  return {
    eventId: event.event_id,
    key: usageRawKey(event.org_id),
    value: codecFor("UsageEvent").encode(event as unknown as Record<string, unknown>),
  };
}

export class UsagePublisher {
  readonly topic: string;
  private readonly producer: Producer;
  private started = false;

  constructor(options: PublisherOptions) {
    this.topic = `${options.topicPrefix ?? ""}usage.raw`;
    const kafka = new Kafka({
      ...options.kafka,
      brokers: options.brokers,
      clientId: options.clientId ?? "spendbus-node-publisher",
    });
    this.producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 5,
      createPartitioner: Partitioners.DefaultPartitioner,
      retry: { retries: options.retries ?? 8, initialRetryTime: 100, maxRetryTime: 5_000 },
    });
  }

  async start(): Promise<void> {
    if (!this.started) {
      await this.producer.connect();
      this.started = true;
    }
  }

  async stop(): Promise<void> {
    if (this.started) {
      await this.producer.disconnect();
      this.started = false;
    }
  }

  /** Publish one event; resolves once every in-sync replica has it. */
  async publish(event: UsageEvent): Promise<void> {
    await this.publishMany([event]);
  }

  /** Publish events (each validated first: one bad event publishes none); resolves once
   * the broker acknowledged them all. Returns how many were published. */
  async publishMany(events: readonly UsageEvent[]): Promise<number> {
    if (!this.started) throw new Error("UsagePublisher: start() it first");
    const prepared = events.map(prepare);
    if (prepared.length === 0) return 0;
    await this.producer.send({
      topic: this.topic,
      acks: -1,
      messages: prepared.map((p) => ({ key: p.key, value: p.value })),
    });
    return prepared.length;
  }
}
