/**
 * Per-handoff telemetry: a record of sizes and durations derived from timestamped events,
 * and a one-line summary. It never holds prompt content, token values or checksums.
 *
 * Timestamps (`atMs`) come from one process's monotonic clock and are only ever subtracted
 * from timestamps of the same process: prefiller events and decoder events are derived
 * separately and only their durations are combined.
 *
 * @module
 */
import type { AbortReason } from "./handoff.ts";
import type { ComponentKind } from "./schema.ts";
import {
  type DecoderTelemetrySummary,
  type PrefillerTelemetrySummary,
  type SpeculationSummary,
  summarizeDecoder,
  summarizePrefiller,
} from "./telemetry_summary.ts";

export * from "./telemetry_summary.ts";
export { formatTelemetry } from "./telemetry_format.ts";

/** Events recorded on the prefiller's (or coordinator's) clock. */
export type PrefillerTelemetryEvent =
  | { type: "request-start"; atMs: number }
  | { type: "prefill-chunk-done"; atMs: number; tokens: number; cached: boolean }
  /**
   * The prompt's last chunk finished computing and the first token was sampled. With layer
   * capture this precedes that chunk's "prefill-chunk-done" (recorded when its page export
   * starts, after the captured layers were handed to the sink); the tail counts from here.
   * `chunkTokens` and `chunkMs`: that chunk's tokens and its compute alone (the decode, not
   * the sends around it), a prefill rate at the prompt's deepest chunk (absent: not timed).
   */
  | { type: "prefill-computed"; atMs: number; chunkTokens?: number; chunkMs?: number }
  | { type: "export"; atMs: number; kind: ComponentKind; bytes: number; durationMs: number }
  /** Handed to the stream's write; `readyAtMs`: when it was exported (absent: not known). */
  | {
    type: "chunk-queued";
    atMs: number;
    seq: number;
    kind: ComponentKind;
    bytes: number;
    readyAtMs?: number;
  }
  /** The chunk's last byte was handed to the transport; `durationMs` is the write's duration. */
  | {
    type: "chunk-sent";
    atMs: number;
    seq: number;
    kind: ComponentKind;
    bytes: number;
    durationMs: number;
  }
  /**
   * The decoder granted credit back for this KV page, which it does once the page is staged
   * (imported, uncommitted): proof, on this process's clock, that the page had arrived.
   */
  | { type: "chunk-staged"; atMs: number; seq: number; bytes: number }
  | { type: "manifest-sent"; atMs: number }
  /** ReserveAccepted arrived: the prefill -> decode round trip of its ReserveRequest. */
  | { type: "reserved"; atMs: number; roundTripMs: number }
  /** The probe digest left, after the manifest (the prefiller's probe ran meanwhile). */
  | { type: "probe-digest-sent"; atMs: number }
  | { type: "commit-ack"; atMs: number }
  /** The first token left for the client (FirstToken sent). */
  | { type: "first-token"; atMs: number }
  | { type: "retry"; atMs: number; reason: AbortReason }
  | { type: "fallback"; atMs: number; reason: AbortReason };

/**
 * How a frame's body arrived (transport/frame.ts FrameArrival): the bytes after the read that
 * brought its header, and the time they took (ms).
 */
export interface ArrivalSpan {
  bytes: number;
  ms: number;
}

/** Events recorded on the decoder's clock. */
export type DecoderTelemetryEvent =
  /** A chunk staged; `arrival`: how its frame's body arrived, where the reader timed it. */
  | {
    type: "import";
    atMs: number;
    kind: ComponentKind;
    bytes: number;
    durationMs: number;
    arrival?: ArrivalSpan;
  }
  | { type: "manifest-received"; atMs: number }
  /** The continuation probe's decode step on the decoder. */
  | { type: "probe"; atMs: number; durationMs: number }
  /** The prefiller's probe digest arrived after its manifest (tag checked). */
  | { type: "probe-digest-received"; atMs: number }
  | { type: "committed"; atMs: number }
  /** Readiness at commit: target state always, MTP when the family has it (null: no MTP). */
  | {
    type: "ready";
    atMs: number;
    target: boolean;
    mtp: boolean | null;
    /** Bitwise parity with the decoder's own colocated run: claimed, or not (and why). */
    parity?: "bitwise" | "not-claimed" | null;
    /** The parity-only identity fields that differ (names, no values). */
    parityFields?: string[];
  }
  /** A generated token left the decoder. */
  | { type: "token"; atMs: number }
  /** What speculative decoding did over the session (once, at its end). */
  | ({ type: "speculation"; atMs: number } & SpeculationSummary);

/** Link facts measured outside the handoff (probe), passed through to the record. */
export interface LinkFacts {
  bandwidthBytesPerS: number | null;
  rttMs: number | null;
}

/** What one handoff cost, in bytes and milliseconds. No content. */
export interface HandoffTelemetry {
  sourceRole: string;
  destRole: string;
  promptTokens: number;
  cachedTokens: number;
  computedTokens: number;
  bytesByComponent: Partial<Record<ComponentKind, number>>;
  totalBytes: number;
  /** State chunks sent and the largest chunk payload (null: an older prefiller). */
  chunksSent: number | null;
  chunkBytesMaxSent: number | null;
  prefillMs: number | null;
  exportMs: number;
  queueMs: number;
  wireMs: number;
  importMs: number;
  /** Decoder: manifest received to commit (validate, tail import, probe). */
  commitMs: number | null;
  /** Decoder: whether bitwise parity with its own colocated run is claimed (null: unknown). */
  parity: "bitwise" | "not-claimed" | null;
  /** Decoder: the parity-only identity fields that differ. */
  parityFields: string[];
  /** Decoder: the last import before commit (the import that could not overlap the wire). */
  lastImportMs: number;
  /** Decoder: the continuation probe's decode step (it also yields token 2's logits). */
  probeMs: number | null;
  /**
   * Decoder: how long its probe result waited for the prefiller's probe digest (0: the digest
   * was there first; null: no digest followed the manifest).
   */
  probeWaitMs: number | null;
  /** Prefiller: manifest sent to CommitAck. */
  commitRoundTripMs: number | null;
  /** Share of KV bytes of all chunks but the last that left before the last chunk finished. */
  overlapFraction: number | null;
  /**
   * Share of KV bytes of all chunks but the last that the decoder had already staged (credit
   * came back) before the last chunk finished: arrival, not just departure.
   */
  stagedBeforePrefillEndFraction: number | null;
  /** End of the last prefill chunk to CommitAck. */
  uncoveredTailMs: number | null;
  /**
   * Prefiller: export work after the end of prefill (the last page, state not captured
   * during the last chunk), without waits for the link; null or absent: not measured.
   */
  tailExportMs?: number | null;
  /**
   * Prefiller, with layer capture: how long before compute end the last recurrent layer's
   * state came out of the exporter (the compute after that layer's last write: later layers,
   * the output, the first token's sampling), during which it was already on its way; null or
   * absent: not captured during the last chunk, or not measured.
   */
  captureLeadMs?: number | null;
  /**
   * Prefiller, with layer capture: each recurrent piece captured during the last chunk, how
   * long before compute end it came out of the exporter (ms) and its bytes, in capture order:
   * when the state was ready to leave (a hybrid model's layers come in groups, its attention
   * layers between them). Null or absent: none captured, or not measured.
   */
  captureSchedule?: [msBeforeEnd: number, bytes: number][] | null;
  /**
   * Decoder: the recurrent pieces after the first, their bytes and the time from the first's
   * arrival (staged) to the last's, in ms: while the sender was behind (`backlogBytes`), the
   * rate the link delivered them at. Null or absent: not measured.
   */
  recurrentArrivalBytes?: number | null;
  recurrentArrivalMs?: number | null;
  /**
   * Decoder: the last state frame of `TAIL_ARRIVAL_BYTES_MIN` or more to arrive, its body bytes
   * after the read that brought its header and the time they took (ms): the rate the link
   * delivered at as the handoff ended, when the prefiller's compute no longer shares the host
   * (`handoffTailSample`). Null or absent: no such frame, or not timed.
   */
  tailArrivalBytes?: number | null;
  tailArrivalMs?: number | null;
  /**
   * Prefiller: the prompt's last computed chunk, its tokens and its compute alone (ms), the
   * rate at the prompt's deepest tokens (node rates learn it at that depth); null or absent:
   * not timed.
   */
  lastChunkTokens?: number | null;
  lastChunkMs?: number | null;
  bandwidthBytesPerS: number | null;
  /** Bytes sent over the summed write time: what the handoff actually achieved. */
  achievedBytesPerS: number | null;
  /**
   * The chunks queued behind the previous write (the link the bottleneck): their bytes, and
   * from the previous write's end to theirs, summed; what the link sustained under a backlog.
   * Absent: an older prefiller.
   */
  backlogBytes?: number;
  backlogMs?: number;
  rttMs: number | null;
  retries: number;
  retryReasons: AbortReason[];
  fallbackReason: AbortReason | null;
  targetReady: boolean;
  mtpReady: boolean | null;
  /** Prefiller's clock: end of prefill to the first token leaving for the client. */
  firstTokenDelayMs: number | null;
  /**
   * End of prefill (prefiller) to the first token received (client), from both processes'
   * wall clocks: meaningful on one host or with synchronized clocks; null when not measured.
   */
  firstTokenAfterPrefillMs: number | null;
  ttftMs: number | null;
  /** Mean gap between generated tokens on the decoder. */
  tpotMs: number | null;
  /** The coordinator's fallbacks for this request, in order (absent: none recorded). */
  fallbacks?: FallbackRecord[];
  /** The decoder's speculative decoding: mode, rollback, fallback, acceptance per source. */
  speculation?: SpeculationSummary;
  /** The path the generating worker decoded on (its GenerateDone's `decodePath`). */
  decodePath?: "per-session" | "batched";
  /**
   * The placement decision's prediction for this request (core/placement.ts), recorded beside
   * the measurement; absent when the placement was not planned.
   */
  prediction?: {
    placement: string;
    ttftDisaggregatedMs: number;
    ttftColocatedMs: number;
    commitTailMs: number;
  } | null;
}

/**
 * One fallback the coordinator took for a request, named (no content): what it did, why, on
 * which node, and how many tokens the client already had (regenerated and checked there).
 */
export interface FallbackRecord {
  kind: FallbackKind;
  reason: string;
  nodeId: string;
  tokensBefore: number;
}

/**
 * `colocated-on-decoder`: the decode worker recomputed the prompt (prefill worker lost, or the
 * pair not eligible). `colocated-on-prefill`: the prefill worker ran the request alone (decode
 * worker unreachable). `completed-on-prefill`: the decode worker was lost before the commit
 * and the prefill worker continued from the state it kept (no recompute). `resumed`: the
 * worker generating was lost; another recomputed the prompt and the tokens already streamed.
 */
export type FallbackKind =
  | "colocated-on-decoder"
  | "colocated-on-prefill"
  | "completed-on-prefill"
  | "resumed";

/**
 * Derives the telemetry record from each side's summary (or its events, folded here).
 *
 * @example
 * ```ts
 * const t = deriveTelemetry({ prefiller: outcome.telemetry, decoder: done.telemetry,
 *   link: { bandwidthBytesPerS: 3e9, rttMs: 0.4 } });
 * console.log(formatTelemetry(t));
 * ```
 */
export function deriveTelemetry(input: {
  prefiller: readonly PrefillerTelemetryEvent[] | PrefillerTelemetrySummary;
  decoder: readonly DecoderTelemetryEvent[] | DecoderTelemetrySummary;
  link?: LinkFacts;
  sourceRole?: string;
  destRole?: string;
  /** Measured by the client: end of prefill to the first token received (see the field). */
  firstTokenAfterPrefillMs?: number | null;
}): HandoffTelemetry {
  const { reserveRoundTripMs, ...p } = _prefillerSide(
    Array.isArray(input.prefiller)
      ? summarizePrefiller(input.prefiller)
      : input.prefiller as PrefillerTelemetrySummary,
  );
  const d = _decoderSide(
    Array.isArray(input.decoder)
      ? summarizeDecoder(input.decoder)
      : input.decoder as DecoderTelemetrySummary,
  );
  return {
    sourceRole: input.sourceRole ?? "prefill",
    destRole: input.destRole ?? "decode",
    ...p,
    ...d,
    bandwidthBytesPerS: input.link?.bandwidthBytesPerS ?? null,
    // Measured outside the handoff when given, else the reservation's own round trip (the
    // decoder's reservation work included: an upper bound on the link's RTT).
    rttMs: input.link?.rttMs ?? reserveRoundTripMs,
    firstTokenAfterPrefillMs: input.firstTokenAfterPrefillMs ?? null,
  };
}

function _sub(a: number | null, b: number | null): number | null {
  return a === null || b === null ? null : a - b;
}

/** Share of non-last KV bytes that `early` bytes are (null with under two pages). */
function _fraction(s: PrefillerTelemetrySummary, early: number): number | null {
  if (s.kvPagesSent < 2 || s.prefillEndMs === null) return null;
  const total = s.kvSentBytes - s.lastKvBytes;
  return total > 0 ? Math.min(1, early / total) : null;
}

/** Compute end less the last recurrent export, where that export came first (layer capture). */
/** The recurrent pieces exported before compute end: [ms before it, bytes] (null: none). */
function _captureSchedule(s: PrefillerTelemetrySummary): [number, number][] | null {
  const end = s.prefillComputedMs ?? null;
  const kept = s.recurrentExports ?? null;
  if (end === null || kept === null) return null;
  const before = kept.filter(([at]) => at <= end).map(([at, b]): [number, number] => [end - at, b]);
  return before.length ? before : null;
}

function _captureLead(s: PrefillerTelemetrySummary): number | null {
  const end = s.prefillComputedMs ?? null;
  const last = s.lastRecurrentExportMs ?? null;
  return end === null || last === null || last > end ? null : end - last;
}

/** When the prompt's last chunk finished computing (older prefillers: its page export). */
function _prefillEnd(s: PrefillerTelemetrySummary): number | null {
  return s.prefillComputedMs ?? s.prefillEndMs;
}

function _prefillerSide(s: PrefillerTelemetrySummary) {
  return {
    promptTokens: s.cachedTokens + s.computedTokens,
    cachedTokens: s.cachedTokens,
    computedTokens: s.computedTokens,
    bytesByComponent: { ...s.bytesByComponent },
    totalBytes: s.totalBytes,
    chunksSent: s.chunksSent ?? null,
    chunkBytesMaxSent: s.chunkBytesMaxSent ?? null,
    reserveRoundTripMs: s.reserveRoundTripMs ?? null,
    prefillMs: _sub(_prefillEnd(s), s.startMs),
    exportMs: s.exportMs,
    queueMs: s.queueMs,
    wireMs: s.wireMs,
    commitRoundTripMs: _sub(s.commitAckMs, s.manifestSentMs),
    overlapFraction: _fraction(s, s.kvSentByPrefillEndBytes),
    stagedBeforePrefillEndFraction: _fraction(s, s.kvStagedByPrefillEndBytes),
    uncoveredTailMs: _sub(s.commitAckMs, _prefillEnd(s)),
    tailExportMs: s.prefillEndMs === null ? null : s.tailExportMs ?? null,
    captureLeadMs: _captureLead(s),
    captureSchedule: _captureSchedule(s),
    lastChunkTokens: s.lastChunkTokens ?? null,
    lastChunkMs: s.lastChunkMs ?? null,
    achievedBytesPerS: s.wireMs > 0 ? (s.totalBytes / s.wireMs) * 1000 : null,
    backlogBytes: s.backlogBytes ?? 0,
    backlogMs: s.backlogMs ?? 0,
    retries: s.retries,
    retryReasons: [...s.retryReasons],
    fallbackReason: s.fallbackReason,
    firstTokenDelayMs: _sub(s.firstTokenMs, _prefillEnd(s)),
    ttftMs: _sub(s.firstTokenMs, s.startMs),
  };
}

/**
 * Share of the KV-page bytes of all chunks but the last that had left by `prefillEndMs`
 * (when the last prefill chunk finished). Null when there is at most one KV chunk.
 *
 * @example
 * ```ts
 * overlapFraction(sentEvents, lastChunkDoneAtMs); // 0.93
 * ```
 */
export function overlapFraction(
  sent: readonly { kind: ComponentKind; bytes: number; atMs: number; seq: number }[],
  prefillEndMs: number | null,
  allPages: readonly { kind: ComponentKind; bytes: number; seq: number }[] = sent,
): number | null {
  const pages = allPages.filter((s) => s.kind === "kv-page").sort((a, b) => a.seq - b.seq);
  if (pages.length < 2 || prefillEndMs === null) return null;
  const nonLast = pages.slice(0, -1);
  const total = nonLast.reduce((s, p) => s + p.bytes, 0);
  if (total === 0) return null;
  const lastSeq = pages[pages.length - 1].seq;
  const early = sent.filter((p) =>
    p.kind === "kv-page" && p.seq !== lastSeq && p.atMs <= prefillEndMs
  )
    .reduce((s, p) => s + p.bytes, 0);
  return early / total;
}

function _decoderSide(s: DecoderTelemetrySummary) {
  const tpotMs = s.tokens >= 2 && s.firstTokenAtMs !== null && s.lastTokenAtMs !== null
    ? (s.lastTokenAtMs - s.firstTokenAtMs) / (s.tokens - 1)
    : null;
  return {
    importMs: s.importMs,
    commitMs: _sub(s.committedMs, s.manifestReceivedMs),
    lastImportMs: s.lastImportMs ?? 0,
    probeMs: s.probeMs ?? null,
    probeWaitMs: s.probeDigestAtMs == null || s.probeDoneAtMs == null
      ? null
      : Math.max(0, s.probeDigestAtMs - s.probeDoneAtMs),
    targetReady: s.ready?.target ?? false,
    parity: s.ready?.parity ?? null,
    parityFields: s.ready?.parityFields ?? [],
    mtpReady: s.ready ? s.ready.mtp : null,
    recurrentArrivalBytes: s.recurrentArrival?.bytesAfterFirst ?? null,
    recurrentArrivalMs: s.recurrentArrival
      ? s.recurrentArrival.lastAtMs - s.recurrentArrival.firstAtMs
      : null,
    tailArrivalBytes: s.tailArrival?.bytes ?? null,
    tailArrivalMs: s.tailArrival?.ms ?? null,
    tpotMs,
    ...(s.speculation ? { speculation: { ...s.speculation } } : {}),
  };
}
