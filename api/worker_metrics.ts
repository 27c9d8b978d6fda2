/**
 * Worker-side gauges on the coordinator's `/metrics`: on each scrape, every worker in the
 * peers file is asked for its counters (`StatsRequest`, serve/stats.ts) in parallel, each
 * bounded by `statsTimeoutMs`; answers are shared by all gauges of one scrape and cached for
 * `statsCacheMs`, so a scrape costs one round trip per worker. A worker that does not answer
 * reads `skippy:worker_up 0` and keeps no other series. Counts only, never content.
 */
import { Gauge, type Registry } from "prom-client";
import type { WorkerCounters } from "../serve/messages.ts";
import type { Node } from "../serve/node.ts";
import { queryStats } from "../serve/stats.ts";
import type { PeerSet } from "./peers.ts";

export interface WorkerMetricsOptions {
  /** Longest wait for one worker's answer (connect + stats), in ms. */
  statsTimeoutMs: number;
  /** Scrapes within this many ms reuse the last answers. */
  statsCacheMs: number;
}

export const DEFAULT_WORKER_METRICS: Readonly<WorkerMetricsOptions> = {
  statsTimeoutMs: 2_000,
  statsCacheMs: 1_000,
};

interface Answer {
  nodeId: string;
  role: string;
  counters: WorkerCounters | null;
}

const GAUGES: [keyof WorkerCounters, string, string][] = [
  ["contextsBusy", "skippy:worker_contexts_busy", "Contexts taken from the worker's pool"],
  ["generating", "skippy:worker_generating", "Generations running on the worker"],
  ["committedSessions", "skippy:worker_committed_sessions", "Committed sessions awaiting generate"],
  ["prefillActive", "skippy:worker_prefill_active", "Handoffs the worker is prefilling"],
  ["decodeAttempts", "skippy:worker_decode_attempts", "Uncommitted handoff attempts"],
  ["retainedBytes", "skippy:worker_retained_bytes", "Exported state retained for retries"],
  ["stagedBytes", "skippy:worker_staged_bytes", "State staged by uncommitted attempts"],
  ["prefillQueued", "skippy:worker_prefill_queued", "Prompts waiting for a prefill context"],
  ["rssBytes", "skippy:worker_resident_memory_bytes", "The worker process's resident memory"],
  [
    "udpReceiveBufferBytes",
    "skippy:worker_udp_receive_buffer_bytes",
    "The worker host's default UDP receive buffer, which its QUIC sockets take (under 4 MiB it " +
    "drops datagrams when the worker falls behind; transport/udp_buffers.ts)",
  ],
  [
    "udpReceiveDrops",
    "skippy:worker_udp_receive_drops",
    "UDP datagrams the worker host's kernel dropped for a full receive buffer since boot " +
    "(host-wide, Linux)",
  ],
  [
    "sequencesBusy",
    "skippy:worker_sequences_busy",
    "Sequences of the batched decode context in use",
  ],
  ["sequencesMax", "skippy:worker_sequences_max", "Sequences of the batched decode context"],
  ["kvCellsUsed", "skippy:worker_kv_cells_used", "KV cells reserved by running sequences"],
  ["kvCellsMax", "skippy:worker_kv_cells_max", "KV cells of the batched decode context"],
  ["recurrentSlotsBusy", "skippy:worker_recurrent_slots_busy", "Recurrent state slots in use"],
  ["admissionWaiting", "skippy:worker_admission_waiting", "Decode requests waiting for a sequence"],
];

export function registerWorkerMetrics(
  registry: Registry,
  node: Node,
  peers: PeerSet,
  options: Partial<WorkerMetricsOptions> = {},
): void {
  const o = { ...DEFAULT_WORKER_METRICS, ...options };
  let cached: { at: number; answers: Promise<Answer[]> } | null = null;
  const answers = () => {
    const now = performance.now();
    if (!cached || now - cached.at > o.statsCacheMs) {
      cached = { at: now, answers: Promise.all(peers.workers.map((w) => ask(node, w, o))) };
    }
    return cached.answers;
  };
  const labelNames = ["node_id", "role"];
  new Gauge({
    name: "skippy:worker_up",
    help: "1 when the worker answered the coordinator's stats request",
    labelNames,
    registers: [registry],
    async collect() {
      this.reset();
      for (const a of await answers()) {
        this.set({ node_id: a.nodeId, role: a.role }, a.counters ? 1 : 0);
      }
    },
  });
  for (const [field, name, help] of GAUGES) {
    new Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      async collect() {
        this.reset();
        for (const a of await answers()) {
          const value = a.counters?.[field];
          if (typeof value === "number") this.set({ node_id: a.nodeId, role: a.role }, value);
        }
      },
    });
  }
}

async function ask(
  node: Node,
  w: PeerSet["workers"][number],
  o: WorkerMetricsOptions,
): Promise<Answer> {
  const answer: Answer = { nodeId: w.peer.nodeId, role: w.role, counters: null };
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), o.statsTimeoutMs);
  });
  const query = (async () => {
    const connection = await node.connect(w.peer);
    try {
      return await queryStats(connection, o.statsTimeoutMs);
    } finally {
      await connection.close().catch(() => {});
    }
  })().catch(() => null);
  try {
    answer.counters = await Promise.race([query, timeout]);
  } finally {
    clearTimeout(timer);
  }
  return answer;
}
