/**
 * The counters a worker reports in StatsReply (`skippy-disagg stats`, `/metrics`): counts and
 * bytes only, never content. Re-exported by messages.ts.
 */

/** What a worker holds: every count returns to zero once its handoffs have ended. */
export interface WorkerCounters extends PrefillQueueCounters {
  /** Prefill side: handoffs running, and bytes of exported state retained for them. */
  prefillActive: number;
  retainedBytes: number;
  /** Decode side: uncommitted attempts, and bytes of state staged for them. */
  decodeAttempts: number;
  stagedBytes: number;
  /** Committed sessions waiting for their GenerateRequest, and generations running. */
  committedSessions: number;
  generating: number;
  /** Contexts taken from the pool (at most sessionsMax). */
  contextsBusy: number;
  /** Since start: reservations accepted, and attempts committed or aborted. */
  reservationsTotal: number;
  commitsTotal: number;
  abortsTotal: number;
  /** The worker's resident set size (bytes), `Deno.memoryUsage().rss`. */
  rssBytes?: number;
  /**
   * The host's default UDP receive buffer (bytes), which the worker's QUIC sockets take, and
   * the datagrams its kernel has dropped for a full one since boot (host-wide; Linux only).
   */
  udpReceiveBufferBytes?: number;
  udpReceiveDrops?: number;
  /** Decode side: which path serves requests (see GenerateDone's `decodePath`). */
  decodePath?: "per-session" | "batched";
  /** Batched decode side: sequences of the shared context, and KV cells, in use and in all. */
  sequencesBusy?: number;
  sequencesMax?: number;
  kvCellsUsed?: number;
  kvCellsMax?: number;
  /** Recurrent slots in use (one per sequence; 0 for a model without recurrent layers). */
  recurrentSlotsBusy?: number;
  /** Sequences out of service (llama.cpp would not remove their state; never handed out). */
  sequencesOutOfService?: number;
  /** Admission: requests waiting for a session now; admitted, queued and refused since start. */
  admissionWaiting?: number;
  admittedTotal?: number;
  queuedTotal?: number;
  refusedBusyTotal?: number;
}

/** The prefill queue's counters (serve/prefill_queue.ts), part of WorkerCounters. */
export interface PrefillQueueCounters {
  /** Requests waiting for a prefill context now. */
  prefillQueued: number;
  /** Since start: requests that waited, that were answered busy, and their wait (ms). */
  prefillQueuedTotal: number;
  prefillBusyTotal: number;
  prefillQueueWaitMsTotal: number;
  /** Since start: the longest wait of a request admitted from the queue (ms). */
  prefillQueueWaitMsMax: number;
}

/**
 * The counters that hold something now (state, sessions, contexts, queued prompts): an idle
 * worker reads zero in each. Tests and `correctness chaos` wait for these after a request.
 */
export const HELD_COUNTER_FIELDS = [
  "prefillActive",
  "prefillQueued",
  "retainedBytes",
  "decodeAttempts",
  "stagedBytes",
  "committedSessions",
  "generating",
  "contextsBusy",
] as const satisfies readonly (keyof WorkerCounters)[];

/** The fields of WorkerCounters, for checks and for summing. */
export const COUNTER_FIELDS: readonly (keyof WorkerCounters)[] = [
  "prefillActive",
  "retainedBytes",
  "decodeAttempts",
  "stagedBytes",
  "committedSessions",
  "generating",
  "contextsBusy",
  "reservationsTotal",
  "commitsTotal",
  "abortsTotal",
  "prefillQueued",
  "prefillQueuedTotal",
  "prefillBusyTotal",
  "prefillQueueWaitMsTotal",
  "prefillQueueWaitMsMax",
];
