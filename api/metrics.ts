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

export class ApiMetrics {
  readonly registry = new Registry();
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly tpot: Histogram;
  readonly e2e: Histogram;
  readonly queue: Histogram;
  readonly promptTokens: Counter;
  /** Prompt tokens restored from the prefill worker's prefix cache (not computed). */
  readonly promptTokensCached: Counter;
  readonly generationTokens: Counter;
  readonly success: Counter;
  readonly failures: Counter;
  readonly responses: Counter;
  readonly placements: Counter;
  readonly fallbacks: Counter;
  readonly handoffBytes: Histogram;
  readonly transfer: Histogram;
  readonly tail: Histogram;
  readonly specDrafted: Counter;
  readonly specAccepted: Counter;
  readonly decodePaths: Counter;
  readonly fallbackKinds: Counter;
  readonly busyRefusals: Counter;
  /** Per prefill -> decode pair: the newest loss probe's loss events per datagram. */
  readonly linkLoss: Gauge;
  /** Per pair: datagrams sent by the loss probes reported so far. */
  readonly linkLossDatagrams: Counter;

  constructor(sources: MetricsSources) {
    const registers = [this.registry];
    const hist = (name: string, help: string, buckets = LATENCY_BUCKETS_S) =>
      new Histogram({ name, help, buckets, registers });
    this.ttft = hist(
      "skippy:time_to_first_token_seconds",
      "Arrival to the first token (queue time included)",
    );
    this.itl = hist("skippy:inter_token_latency_seconds", "Gap between generated tokens");
    this.tpot = hist(
      "skippy:request_time_per_output_token_seconds",
      "(e2e - ttft) / (generated tokens - 1), per request",
    );
    this.e2e = hist(
      "skippy:e2e_request_latency_seconds",
      "Arrival to the last token (queue time included)",
    );
    this.queue = hist("skippy:request_queue_time_seconds", "Time waiting for admission");
    this.promptTokens = new Counter({
      name: "skippy:prompt_tokens_total",
      help: "Prompt tokens of finished requests",
      registers,
    });
    this.promptTokensCached = new Counter({
      name: "skippy:prompt_tokens_cached_total",
      help: "Prompt tokens of finished requests restored from the prefill worker's prefix cache",
      registers,
    });
    this.generationTokens = new Counter({
      name: "skippy:generation_tokens_total",
      help: "Generated tokens of finished requests",
      registers,
    });
    this.success = new Counter({
      name: "skippy:request_success_total",
      help: "Requests finished, by finish reason",
      labelNames: ["finished_reason"],
      registers,
    });
    this.failures = new Counter({
      name: "skippy:request_failures_total",
      help: "Requests that failed after admission (500), by reason",
      labelNames: ["reason"],
      registers,
    });
    this.responses = new Counter({
      name: "skippy:http_responses_total",
      help: "HTTP responses by route and status",
      labelNames: ["route", "status"],
      registers,
    });
    this.placements = new Counter({
      name: "skippy:handoff_placements_total",
      help: "Requests by where they ran: disaggregated or colocated",
      labelNames: ["placement"],
      registers,
    });
    this.fallbacks = new Counter({
      name: "skippy:handoff_fallbacks_total",
      help: "Requests planned disaggregated that ran colocated, by reason",
      labelNames: ["reason"],
      registers,
    });
    this.handoffBytes = hist(
      "skippy:handoff_bytes",
      "State bytes moved per handoff",
      BYTES_BUCKETS,
    );
    this.transfer = hist("skippy:handoff_transfer_seconds", "Wire time per handoff");
    this.tail = hist(
      "skippy:handoff_tail_seconds",
      "End of the last prefill chunk to commit (the uncovered tail)",
    );
    // llama-server's and vLLM's names for speculative decoding, per draft source.
    this.specDrafted = new Counter({
      name: "skippy:spec_decode_num_draft_tokens_total",
      help: "Tokens drafted by speculative decoding, by source (mtp, suffix)",
      labelNames: ["source"],
      registers,
    });
    this.specAccepted = new Counter({
      name: "skippy:spec_decode_num_accepted_tokens_total",
      help: "Drafted tokens the target model accepted, by source (mtp, suffix)",
      labelNames: ["source"],
      registers,
    });
    this.decodePaths = new Counter({
      name: "skippy:decode_path_requests_total",
      help: "Finished requests by the decode worker's path (batched or per-session)",
      labelNames: ["path"],
      registers,
    });
    this.fallbackKinds = new Counter({
      name: "skippy:request_fallbacks_total",
      help:
        "Fallbacks the coordinator took, by kind (colocated-on-decoder, colocated-on-prefill, " +
        "completed-on-prefill, resumed)",
      labelNames: ["kind"],
      registers,
    });
    this.busyRefusals = new Counter({
      name: "skippy:busy_refusals_total",
      help: "Requests answered 503 because a worker had no room (WorkerBusyError)",
      registers,
    });
    this.linkLoss = new Gauge({
      name: "skippy:link_loss_fraction",
      help: "The prefill worker's newest datagram loss probe of its link to the decode worker: " +
        "loss events (runs of lost datagrams) per datagram sent",
      labelNames: ["prefill", "decode"],
      registers,
    });
    this.linkLossDatagrams = new Counter({
      name: "skippy:link_loss_probe_datagrams_total",
      help: "Datagrams the prefill worker's loss probes of this link sent (each probe once)",
      labelNames: ["prefill", "decode"],
      registers,
    });
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
