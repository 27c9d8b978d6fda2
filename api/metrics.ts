/**
 * The coordinator's Prometheus metrics (prom-client), named after vLLM's (`vllm:` ->
 * `skippy:`) and llama-server's conventions, plus the handoff's own: bytes, transfer time,
 * tail, placement, fallbacks and failures by reason. Never content, never a key; labels are
 * bounded sets (placements, finish reasons, failure reasons from core's list, HTTP statuses).
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { FallbackRecord, HandoffTelemetry } from "../core/telemetry.ts";

const LATENCY_BUCKETS_S = [
  0.001,
  0.005,
  0.01,
  0.02,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
  120,
  300,
];
const BYTES_BUCKETS = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 28, 1 << 30];

export interface MetricsSources {
  running: () => number;
  waiting: () => number;
}

/**
 * Every metric is a field defined where it is declared; fields initialize in this order, which
 * is the order of /metrics' text. The admission gauges, read at each scrape, come last.
 */
export class ApiMetrics {
  readonly registry = new Registry();

  // The client's latencies, from arrival (queue time included, as vLLM's).
  readonly ttft = histogram(
    this.registry,
    "skippy:time_to_first_token_seconds",
    "Arrival to the first token (queue time included)",
  );
  readonly itl = histogram(
    this.registry,
    "skippy:inter_token_latency_seconds",
    "Gap between generated tokens",
  );
  readonly tpot = histogram(
    this.registry,
    "skippy:request_time_per_output_token_seconds",
    "(e2e - ttft) / (generated tokens - 1), per request",
  );
  readonly e2e = histogram(
    this.registry,
    "skippy:e2e_request_latency_seconds",
    "Arrival to the last token (queue time included)",
  );
  readonly queue = histogram(
    this.registry,
    "skippy:request_queue_time_seconds",
    "Time waiting for admission",
  );

  // Tokens and how requests ended.
  readonly promptTokens = counter(
    this.registry,
    "skippy:prompt_tokens_total",
    "Prompt tokens of finished requests",
  );
  /** Prompt tokens restored from the prefill worker's prefix cache (not computed). */
  readonly promptTokensCached = counter(
    this.registry,
    "skippy:prompt_tokens_cached_total",
    "Prompt tokens of finished requests restored from the prefill worker's prefix cache",
  );
  readonly generationTokens = counter(
    this.registry,
    "skippy:generation_tokens_total",
    "Generated tokens of finished requests",
  );
  readonly success = counter(
    this.registry,
    "skippy:request_success_total",
    "Requests finished, by finish reason",
    ["finished_reason"],
  );
  readonly failures = counter(
    this.registry,
    "skippy:request_failures_total",
    "Requests that failed after admission (500), by reason",
    ["reason"],
  );
  readonly responses = counter(
    this.registry,
    "skippy:http_responses_total",
    "HTTP responses by route and status",
    ["route", "status"],
  );

  // The handoff: where requests ran, why a planned one did not, and what it moved.
  readonly placements = counter(
    this.registry,
    "skippy:handoff_placements_total",
    "Requests by where they ran: disaggregated or colocated",
    ["placement"],
  );
  readonly fallbacks = counter(
    this.registry,
    "skippy:handoff_fallbacks_total",
    "Requests planned disaggregated that ran colocated, by reason",
    ["reason"],
  );
  readonly handoffBytes = histogram(
    this.registry,
    "skippy:handoff_bytes",
    "State bytes moved per handoff",
    BYTES_BUCKETS,
  );
  readonly transfer = histogram(
    this.registry,
    "skippy:handoff_transfer_seconds",
    "Wire time per handoff",
  );
  readonly tail = histogram(
    this.registry,
    "skippy:handoff_tail_seconds",
    "End of the last prefill chunk to commit (the uncovered tail)",
  );

  // llama-server's and vLLM's names for speculative decoding, per draft source.
  readonly specDrafted = counter(
    this.registry,
    "skippy:spec_decode_num_draft_tokens_total",
    "Tokens drafted by speculative decoding, by source (mtp, suffix)",
    ["source"],
  );
  readonly specAccepted = counter(
    this.registry,
    "skippy:spec_decode_num_accepted_tokens_total",
    "Drafted tokens the target model accepted, by source (mtp, suffix)",
    ["source"],
  );

  // The decode path, the fallbacks taken and busy workers.
  readonly decodePaths = counter(
    this.registry,
    "skippy:decode_path_requests_total",
    "Finished requests by the decode worker's path (batched or per-session)",
    ["path"],
  );
  readonly fallbackKinds = counter(
    this.registry,
    "skippy:request_fallbacks_total",
    "Fallbacks the coordinator took, by kind (colocated-on-decoder, colocated-on-prefill, " +
      "completed-on-prefill, resumed)",
    ["kind"],
  );
  readonly busyRefusals = counter(
    this.registry,
    "skippy:busy_refusals_total",
    "Requests answered 503 because a worker had no room (WorkerBusyError)",
  );

  /** Per prefill -> decode pair: the newest loss probe's loss events per datagram. */
  readonly linkLoss: Gauge = new Gauge({
    name: "skippy:link_loss_fraction",
    help: "The prefill worker's newest datagram loss probe of its link to the decode worker: " +
      "loss events (runs of lost datagrams) per datagram sent",
    labelNames: ["prefill", "decode"],
    registers: [this.registry],
  });
  /** Per pair: datagrams sent by the loss probes reported so far. */
  readonly linkLossDatagrams = counter(
    this.registry,
    "skippy:link_loss_probe_datagrams_total",
    "Datagrams the prefill worker's loss probes of this link sent (each probe once)",
    ["prefill", "decode"],
  );

  constructor(sources: MetricsSources) {
    registerAdmissionGauges(this.registry, sources);
  }

  /**
   * A loss probe an outcome carried (node ids label it: a bounded set, the configured workers).
   * The caller passes each probe once, however many outcomes repeat it.
   */
  observeLinkLoss(
    prefill: string,
    decode: string,
    loss: { sent: number; lossEvents: number },
  ): void {
    this.linkLoss.set({ prefill, decode }, loss.lossEvents / loss.sent);
    this.linkLossDatagrams.inc({ prefill, decode }, loss.sent);
  }

  /** A handoff's telemetry (only when the state moved). */
  observeHandoff(t: HandoffTelemetry): void {
    this.handoffBytes.observe(t.totalBytes);
    this.transfer.observe(t.wireMs / 1000);
    if (t.uncoveredTailMs !== null) this.tail.observe(t.uncoveredTailMs / 1000);
  }

  /** What every finished request reports: speculation, decode path and fallbacks taken. */
  observeRequest(t: HandoffTelemetry, fallbacks: readonly FallbackRecord[]): void {
    const s = t.speculation;
    if (s && s.mode !== "none") {
      this.specDrafted.inc({ source: "mtp" }, s.mtpDrafted);
      this.specAccepted.inc({ source: "mtp" }, s.mtpAccepted);
      this.specDrafted.inc({ source: "suffix" }, s.suffixDrafted);
      this.specAccepted.inc({ source: "suffix" }, s.suffixAccepted);
    }
    if (t.decodePath) this.decodePaths.inc({ path: t.decodePath });
    for (const f of fallbacks) this.fallbackKinds.inc({ kind: f.kind });
  }

  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

/** A histogram in `registry` (latency buckets unless given). */
function histogram(
  registry: Registry,
  name: string,
  help: string,
  buckets = LATENCY_BUCKETS_S,
): Histogram {
  return new Histogram({ name, help, buckets, registers: [registry] });
}

/** A counter in `registry`, with the given labels (none by default). */
function counter(
  registry: Registry,
  name: string,
  help: string,
  labelNames: string[] = [],
): Counter {
  return new Counter({ name, help, labelNames, registers: [registry] });
}

/** Requests running and waiting, read from admission at each scrape. */
function registerAdmissionGauges(registry: Registry, sources: MetricsSources): void {
  const registers = [registry];
  new Gauge({
    name: "skippy:num_requests_running",
    help: "Requests admitted and running",
    registers,
    collect() {
      this.set(sources.running());
    },
  });
  new Gauge({
    name: "skippy:num_requests_waiting",
    help: "Requests waiting for admission",
    registers,
    collect() {
      this.set(sources.waiting());
    },
  });
}
