/**
 * Fixed-size telemetry summaries: each side folds its events as they happen into counts, sums,
 * first and last times and bytes per component, so what travels in PrefillOutcome and
 * GenerateDone has the same size for a 10-token prompt and a 262,144-token one.
 * `deriveTelemetry` (core/telemetry.ts) turns the two summaries into the handoff's record.
 *
 * @module
 */
import type { AbortReason } from "./handoff.ts";
import type { ComponentKind } from "./schema.ts";
import type { ArrivalSpan, DecoderTelemetryEvent, PrefillerTelemetryEvent } from "./telemetry.ts";

/** Retry reasons kept in a summary (the retry count itself is exact). */
export const RETRY_REASONS_MAX = 16;
/**
 * KV sends (and staged grants) remembered to correct the overlap snapshot: a prefill chunk's
 * end is recorded after its page export, so sends that finished during that export must not
 * count as early. More than this many sends during one page export is not possible with a
 * bounded export queue of whole pages; were it to happen, those sends count as early.
 */
const RECENT_MAX = 32;

/**
 * What the prefiller's events add up to: fixed-size (counts, sums, first and last times, bytes
 * per component), whatever the prompt length. It travels in PrefillOutcome.
 */
export interface PrefillerTelemetrySummary {
  startMs: number | null;
  /**
   * End of the last prefill chunk: when its page export started, or when its compute ended
   * if later (a page captured during the chunk left before).
   */
  prefillEndMs: number | null;
  /** When the last chunk's compute finished and the first token was sampled. */
  prefillComputedMs?: number | null;
  /** That chunk's tokens and its compute alone (absent: not timed). */
  lastChunkTokens?: number | null;
  lastChunkMs?: number | null;
  /**
   * When the last recurrent piece (conv or SSM) came out of the exporter: with layer capture,
   * the last Mamba layer's capture, before compute end; without it, after.
   */
  lastRecurrentExportMs?: number | null;
  /**
   * Each recurrent piece as it came out of the exporter: [when, bytes], in order, at most
   * `RECURRENT_EXPORTS_MAX` (more: null, the schedule is not kept).
   */
  recurrentExports?: [atMs: number, bytes: number][] | null;
  cachedTokens: number;
  computedTokens: number;
  bytesByComponent: Partial<Record<ComponentKind, number>>;
  totalBytes: number;
  /** State chunks sent, and the largest payload among them (bounded chunks, schema 3). */
  chunksSent?: number;
  chunkBytesMaxSent?: number;
  /** The shortest ReserveRequest -> ReserveAccepted round trip over attempts, in ms. */
  reserveRoundTripMs?: number;
  exportMs: number;
  queueMs: number;
  wireMs: number;
  /**
   * The chunks exported before the previous chunk's write ended while the stream was full
   * (the link the bottleneck): their bytes, and from the previous write's end to theirs,
   * summed. Absent: an older prefiller.
   */
  backlogBytes?: number;
  backlogMs?: number;
  manifestSentMs: number | null;
  commitAckMs: number | null;
  firstTokenMs: number | null;
  retries: number;
  /** The first RETRY_REASONS_MAX retry reasons, in order. */
  retryReasons: AbortReason[];
  fallbackReason: AbortReason | null;
  /** KV bytes sent, and the bytes of the highest-seq page sent (the "last" page). */
  kvSentBytes: number;
  kvPagesSent: number;
  lastKvSeq: number;
  lastKvBytes: number;
  /** KV bytes sent / staged by the end of prefill (snapshot at the last chunk end). */
  kvSentByPrefillEndBytes: number;
  kvStagedByPrefillEndBytes: number;
  /**
   * Export work that started at or after the end of prefill (the last page and whatever state
   * was not captured during the last chunk), summed: the prefiller's own part of the tail,
   * without any wait for the link or the decoder's credit.
   */
  tailExportMs?: number;
}

/**
 * More than a QUIC stream's send window takes at once (~1.25 MB on Deno QUIC, FINDINGS section
 * 000): a write this large waits for room, so the window is full when it ends.
 */
export const SEND_WINDOW_BYTES_MAX = 2 * 1024 * 1024;

/** A write that took this long waited for room: handing a chunk to a stream with room is a copy. */
export const WRITE_WAITED_MS = 2;

/** Recurrent pieces a handoff's summary keeps the export times of (two per layer on hybrids). */
export const RECURRENT_EXPORTS_MAX = 1024;

/**
 * The smallest frame body whose arrival the decoder keeps as the handoff's tail sample: a
 * large frame arrives over many reads, so its span is the link's time, not one read's.
 */
export const TAIL_ARRIVAL_BYTES_MIN = 1024 * 1024;

/** What the decoder's events add up to: fixed-size, whatever the generation length. */
export interface DecoderTelemetrySummary {
  importMs: number;
  /** The last import before commit: what could not overlap the transfer. */
  lastImportMs: number;
  /** The continuation probe's decode (which also yields the second token's logits). */
  probeMs: number | null;
  /** When the decoder's probe finished, and when a following probe digest arrived. */
  probeDoneAtMs: number | null;
  probeDigestAtMs: number | null;
  manifestReceivedMs: number | null;
  committedMs: number | null;
  ready: {
    target: boolean;
    mtp: boolean | null;
    parity?: "bitwise" | "not-claimed" | null;
    parityFields?: string[];
  } | null;
  tokens: number;
  /**
   * The recurrent pieces (conv, ssm) staged on arrival: the first's staging end, the last's,
   * and the bytes of every piece after the first (absent: none arrived).
   */
  recurrentArrival?: { firstAtMs: number; lastAtMs: number; bytesAfterFirst: number };
  /** The last chunk staged with `TAIL_ARRIVAL_BYTES_MIN` or more timed (absent: none). */
  tailArrival?: ArrivalSpan;
  firstTokenAtMs: number | null;
  lastTokenAtMs: number | null;
  /** Speculative decoding's mode and acceptance per source (absent: none was reported). */
  speculation?: SpeculationSummary;
}

/**
 * Speculation over one session: the mode, how rejected positions rolled back, the MTP
 * readiness that was verified, the named fallback (null: none) and token counts per source.
 */
export interface SpeculationSummary {
  mode: "none" | "mtp" | "suffix" | "mtp+suffix";
  rollback: "attention" | "native" | "checkpoint" | null;
  mtpReadiness: "ready" | "lagging-one" | "not-ready" | null;
  fallback: string | null;
  /** Why the loop ran on another context than the session's own (null or absent: it did not). */
  route?: string | null;
  rounds: number;
  mtpDrafted: number;
  mtpAccepted: number;
  suffixDrafted: number;
  suffixAccepted: number;
  rolledBack: number;
}

/**
 * Folds prefiller events into a PrefillerTelemetrySummary as they happen, in O(1) memory per
 * handoff (plus the chunks queued but not yet sent). `push` takes the same events an array
 * would, so recording code reads the same.
 *
 * @example
 * ```ts
 * const t = new PrefillerTelemetry();
 * t.push({ type: "request-start", atMs: performance.now() });
 * const summary = t.summary(); // fixed size, JSON-safe
 * ```
 */
export class PrefillerTelemetry {
  readonly #s: PrefillerTelemetrySummary = {
    startMs: null,
    prefillEndMs: null,
    cachedTokens: 0,
    computedTokens: 0,
    bytesByComponent: {},
    totalBytes: 0,
    chunksSent: 0,
    chunkBytesMaxSent: 0,
    exportMs: 0,
    queueMs: 0,
    wireMs: 0,
    backlogBytes: 0,
    backlogMs: 0,
    manifestSentMs: null,
    commitAckMs: null,
    firstTokenMs: null,
    retries: 0,
    retryReasons: [],
    fallbackReason: null,
    kvSentBytes: 0,
    kvPagesSent: 0,
    lastKvSeq: -1,
    lastKvBytes: 0,
    kvSentByPrefillEndBytes: 0,
    kvStagedByPrefillEndBytes: 0,
    tailExportMs: 0,
  };
  /** Queue time of chunks queued and not yet sent, by seq. */
  readonly #queued = new Map<number, number>();
  /** When chunks queued and not yet sent were exported, by seq. */
  readonly #ready = new Map<number, number>();
  readonly #recentSent: { atMs: number; bytes: number }[] = [];
  readonly #recentStaged: { atMs: number; bytes: number }[] = [];
  #kvStagedBytes = 0;
  /** When the previous chunk's write ended (null: none yet). */
  #lastWriteEndMs: number | null = null;
  /** Whether the stream's send window was full when it ended. */
  #lastWriteFull = false;

  /** Prefill has run at least until `atMs`: the last chunk's end moves there if later. */
  #prefillEnd(atMs: number): void {
    const s = this.#s;
    if (s.prefillEndMs !== null && atMs < s.prefillEndMs) return;
    s.prefillEndMs = atMs;
    s.tailExportMs = 0; // only exports after the last chunk's end count
    s.kvSentByPrefillEndBytes = s.kvSentBytes - _after(this.#recentSent, atMs);
    s.kvStagedByPrefillEndBytes = this.#kvStagedBytes - _after(this.#recentStaged, atMs);
  }

  #export(e: Extract<PrefillerTelemetryEvent, { type: "export" }>): void {
    const s = this.#s;
    s.exportMs += e.durationMs;
    if (e.kind === "conv" || e.kind === "ssm") {
      s.lastRecurrentExportMs = Math.max(s.lastRecurrentExportMs ?? -Infinity, e.atMs);
      const kept = s.recurrentExports === undefined ? [] : s.recurrentExports;
      if (kept !== null) kept.push([e.atMs, e.bytes]);
      s.recurrentExports = kept === null || kept.length > RECURRENT_EXPORTS_MAX ? null : kept;
    }
    // The last page's export starts exactly at the chunk's end (the same subtraction).
    if (s.prefillEndMs !== null && e.atMs - e.durationMs >= s.prefillEndMs - 1e-6) {
      s.tailExportMs = (s.tailExportMs ?? 0) + e.durationMs;
    }
  }

  #chunkSent(e: Extract<PrefillerTelemetryEvent, { type: "chunk-sent" }>): void {
    const s = this.#s;
    s.bytesByComponent[e.kind] = (s.bytesByComponent[e.kind] ?? 0) + e.bytes;
    s.totalBytes += e.bytes;
    s.chunksSent = (s.chunksSent ?? 0) + 1;
    s.chunkBytesMaxSent = Math.max(s.chunkBytesMaxSent ?? 0, e.bytes);
    s.wireMs += e.durationMs;
    const q = this.#queued.get(e.seq);
    this.#queued.delete(e.seq);
    // Queue time: from queued to the start of its write.
    if (q !== undefined) s.queueMs += Math.max(0, e.atMs - e.durationMs - q);
    // Waiting when the previous write ended with the send window full: the stream took its
    // bytes as fast as the link drained them. A write ends with the window full when it had to
    // wait for room: it was larger than the window, it took longer than a copy does, or it
    // began full itself.
    const prev = this.#lastWriteEndMs, ready = this.#ready.get(e.seq);
    this.#ready.delete(e.seq);
    const behind = ready !== undefined && prev !== null && ready <= prev && e.atMs > prev &&
      this.#lastWriteFull;
    if (behind) {
      s.backlogBytes = (s.backlogBytes ?? 0) + e.bytes;
      s.backlogMs = (s.backlogMs ?? 0) + (e.atMs - prev!);
    }
    this.#lastWriteEndMs = e.atMs;
    this.#lastWriteFull = behind || e.bytes >= SEND_WINDOW_BYTES_MAX ||
      e.durationMs >= WRITE_WAITED_MS;
    if (e.kind !== "kv-page") return;
    s.kvSentBytes += e.bytes;
    s.kvPagesSent++;
    if (e.seq >= s.lastKvSeq) {
      s.lastKvSeq = e.seq;
      s.lastKvBytes = e.bytes;
    }
    _remember(this.#recentSent, e);
  }

  push(e: PrefillerTelemetryEvent): void {
    const s = this.#s;
    switch (e.type) {
      case "request-start":
        s.startMs ??= e.atMs;
        return;
      case "prefill-chunk-done":
        if (e.cached) s.cachedTokens += e.tokens;
        else s.computedTokens += e.tokens;
        this.#prefillEnd(e.atMs);
        return;
      case "prefill-computed":
        s.prefillComputedMs = e.atMs;
        if (e.chunkTokens !== undefined && e.chunkMs !== undefined) {
          s.lastChunkTokens = e.chunkTokens;
          s.lastChunkMs = e.chunkMs;
        }
        // A last page captured during the last chunk was queued before its compute ended.
        this.#prefillEnd(e.atMs);
        return;
      case "export":
        this.#export(e);
        return;
      case "chunk-queued":
        this.#queued.set(e.seq, e.atMs);
        if (e.readyAtMs !== undefined) this.#ready.set(e.seq, e.readyAtMs);
        return;
      case "chunk-sent":
        this.#chunkSent(e);
        return;
      case "chunk-staged":
        this.#kvStagedBytes += e.bytes;
        _remember(this.#recentStaged, e);
        return;
      case "manifest-sent":
        s.manifestSentMs ??= e.atMs;
        return;
      case "reserved":
        s.reserveRoundTripMs = Math.min(s.reserveRoundTripMs ?? Infinity, e.roundTripMs);
        return;
      case "commit-ack":
        s.commitAckMs ??= e.atMs;
        return;
      case "first-token":
        s.firstTokenMs ??= e.atMs;
        return;
      case "retry":
        s.retries++;
        if (s.retryReasons.length < RETRY_REASONS_MAX) s.retryReasons.push(e.reason);
        return;
      case "fallback":
        s.fallbackReason ??= e.reason;
        return;
    }
  }

  /** A copy of the summary so far. */
  summary(): PrefillerTelemetrySummary {
    const s = this.#s;
    return {
      ...s,
      bytesByComponent: { ...s.bytesByComponent },
      retryReasons: [...s.retryReasons],
      ...(s.recurrentExports
        ? { recurrentExports: s.recurrentExports.map(([a, b]) => [a, b]) }
        : {}),
    };
  }
}

/** Folds decoder events into a DecoderTelemetrySummary, in O(1) memory. */
export class DecoderTelemetry {
  readonly #s: DecoderTelemetrySummary = {
    importMs: 0,
    lastImportMs: 0,
    probeMs: null,
    probeDoneAtMs: null,
    probeDigestAtMs: null,
    manifestReceivedMs: null,
    committedMs: null,
    ready: null,
    tokens: 0,
    firstTokenAtMs: null,
    lastTokenAtMs: null,
  };

  #recurrentArrived(e: { atMs: number; bytes: number }): void {
    const a = this.#s.recurrentArrival;
    if (!a) this.#s.recurrentArrival = { firstAtMs: e.atMs, lastAtMs: e.atMs, bytesAfterFirst: 0 };
    else {
      a.lastAtMs = Math.max(a.lastAtMs, e.atMs);
      a.bytesAfterFirst += e.bytes;
    }
  }

  push(e: DecoderTelemetryEvent): void {
    const s = this.#s;
    switch (e.type) {
      case "import":
        s.importMs += e.durationMs;
        s.lastImportMs = e.durationMs;
        if ((e.kind === "conv" || e.kind === "ssm") && e.bytes > 0) this.#recurrentArrived(e);
        if (e.arrival && e.arrival.bytes >= TAIL_ARRIVAL_BYTES_MIN && e.arrival.ms > 0) {
          s.tailArrival = { ...e.arrival };
        }
        return;
      case "probe":
        s.probeMs = e.durationMs;
        s.probeDoneAtMs = e.atMs;
        return;
      case "probe-digest-received":
        s.probeDigestAtMs ??= e.atMs;
        return;
      case "manifest-received":
        s.manifestReceivedMs ??= e.atMs;
        return;
      case "committed":
        s.committedMs ??= e.atMs;
        return;
      case "ready":
        s.ready = {
          target: e.target,
          mtp: e.mtp,
          parity: e.parity ?? null,
          parityFields: [...(e.parityFields ?? [])].slice(0, 16),
        };
        return;
      case "token":
        s.tokens++;
        s.firstTokenAtMs ??= e.atMs;
        s.lastTokenAtMs = e.atMs;
        return;
      case "speculation": {
        const { type: _type, atMs: _atMs, ...summary } = e;
        s.speculation = summary;
        return;
      }
    }
  }

  summary(): DecoderTelemetrySummary {
    const speculation = this.#s.speculation && { ...this.#s.speculation };
    return {
      ...this.#s,
      ready: this.#s.ready && { ...this.#s.ready },
      ...(this.#s.tailArrival ? { tailArrival: { ...this.#s.tailArrival } } : {}),
      ...(speculation ? { speculation } : {}),
    };
  }
}

function _remember(ring: { atMs: number; bytes: number }[], e: { atMs: number; bytes: number }) {
  ring.push({ atMs: e.atMs, bytes: e.bytes });
  if (ring.length > RECENT_MAX) ring.shift();
}

function _after(ring: readonly { atMs: number; bytes: number }[], atMs: number): number {
  return ring.reduce((sum, r) => sum + (r.atMs > atMs ? r.bytes : 0), 0);
}

/** The summary of `events` (each side's events, folded in order). */
export function summarizePrefiller(
  events: readonly PrefillerTelemetryEvent[],
): PrefillerTelemetrySummary {
  const t = new PrefillerTelemetry();
  for (const e of events) t.push(e);
  return t.summary();
}

export function summarizeDecoder(
  events: readonly DecoderTelemetryEvent[],
): DecoderTelemetrySummary {
  const t = new DecoderTelemetry();
  for (const e of events) t.push(e);
  return t.summary();
}
