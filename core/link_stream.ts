/**
 * When the last byte of a handoff's page stream leaves, for the planner (core/planner.ts): KV
 * pages released as chunks finish (the cached prefix at once, behind the token history, which
 * is final before prefill: `knownBytes`), and with layer capture the recurrent state released
 * while the last chunk computes, one recurrent layer at a time, all in one FIFO at the
 * measured bandwidth, starting once the reservation round trip is done.
 * The last chunk takes its own rate where the node's rates give one (deeper tokens cost more,
 * so it is longer than an average chunk, and the layers spread over more time). With layer
 * capture the engine computes a prompt's remainder first, so the last chunk, which the capture
 * hides behind, is a full one (serve/engine.ts); without it the remainder comes last. Pure.
 *
 * @module
 */

/** What the stream depends on (a subset of `PlanInput`). */
export interface StreamInput {
  promptTokens: number;
  prefillerCachedTokens?: number;
  chunkTokens: number;
  prefillerPrefillTokensPerS: number;
  /** The rate over the last chunk alone (absent: the average); earlier chunks share the rest. */
  prefillerLastChunkTokensPerS?: number;
  /** Layer capture: the remainder is computed first and the last chunk is a full one. */
  snapshotDuringLastChunk?: boolean;
  state: { kvBytesPerToken: number };
  /**
   * Bytes final before prefill starts (the token history), which leave at its start ahead of
   * the first page (serve/exporter.ts); absent: none.
   */
  knownBytes?: number;
}

/** Prefill time, the stream's finish beyond it, the last page, and the share of pages hidden. */
export interface StreamFinish {
  prefillMs: number;
  uncoveredMs: number;
  lastPageBytes: number;
  overlapFraction: number | null;
}

/** The prefill's chunks in time: how many, the last one's tokens and length, the others' rate. */
export interface ChunkTimes {
  /** Tokens computed (the prompt less the cached prefix). */
  computed: number;
  /** Chunks computed. */
  n: number;
  firstTokens: number;
  lastTokens: number;
  prefillMs: number;
  /** The last chunk's compute, during which captured layers are released. */
  lastChunkMs: number;
  /** Tokens per ms of the chunks before the last. */
  earlyTps: number;
  /** Tokens computed once chunk `j` (0..n) has: 0 before the first, `computed` after the last. */
  tokensAfter: (j: number) => number;
}

/**
 * Tokens in the last of the chunks that compute `computed` tokens, `chunkTokens` at a time: a
 * full chunk when the remainder goes first (layer capture), else the remainder.
 *
 * @example
 * ```ts
 * lastChunkTokens(2036, 512, true); // 512: the first chunk takes the 500 left over
 * lastChunkTokens(2036, 512, false); // 500
 * ```
 */
export function lastChunkTokens(
  computed: number,
  chunkTokens: number,
  remainderFirst: boolean,
): number {
  if (!(computed > 0)) return 0;
  const n = Math.ceil(computed / chunkTokens);
  return n > 1 && remainderFirst ? chunkTokens : computed - (n - 1) * chunkTokens;
}

/**
 * When the chunks compute: the last at its own rate where known (never longer than the whole
 * prefill), the chunks before it evenly over the rest.
 *
 * @example
 * ```ts
 * chunkTimes(input).lastChunkMs;
 * ```
 */
export function chunkTimes(i: StreamInput): ChunkTimes {
  const tps = i.prefillerPrefillTokensPerS / 1000;
  const computed = i.promptTokens - (i.prefillerCachedTokens ?? 0);
  const n = Math.ceil(computed / i.chunkTokens);
  const remainderFirst = i.snapshotDuringLastChunk === true;
  const lastTokens = lastChunkTokens(computed, i.chunkTokens, remainderFirst);
  const firstTokens = n > 1 ? computed - lastTokens - (n - 2) * i.chunkTokens : computed;
  const prefillMs = computed / tps;
  const ownMs = lastTokens / ((i.prefillerLastChunkTokensPerS ?? 0) / 1000);
  const lastChunkMs = n === 0 ? 0 : n > 1 && ownMs < prefillMs ? ownMs : lastTokens / tps;
  const earlyTps = n > 1 ? (computed - lastTokens) / (prefillMs - lastChunkMs) : tps;
  const tokensAfter = (j: number) =>
    j <= 0 ? 0 : j >= n ? computed : firstTokens + (j - 1) * i.chunkTokens;
  return { computed, n, firstTokens, lastTokens, prefillMs, lastChunkMs, earlyTps, tokensAfter };
}

/**
 * When, within the last chunk, each captured piece is released: a share of the last chunk's
 * compute before its end, and a share of the captured bytes (HandoffCosts.captureSchedule, as
 * a pair's handoffs measured it).
 */
export type CaptureSchedule = readonly (readonly [fractionBeforeEnd: number, byteShare: number])[];

/**
 * The stream's finish after prefill end, in milliseconds (`bwPerMs`: bytes per millisecond).
 *
 * @example
 * ```ts
 * streamFinish(input, 125_000, 0.5).uncoveredMs; // 1 Gbit/s, 0.5 ms RTT
 * streamFinish(input, 125_000, 0.5, recurrentBytes); // with layer capture
 * streamFinish(input, 125_000, 0.5, recurrentBytes, true); // the last page captured too
 * streamFinish(input, 125_000, 0.5, recurrentBytes, true, 40); // in 40 layers' pieces
 * streamFinish(input, 125_000, 0.5, recurrentBytes, true, 40, 12); // the last 12 ms early
 * streamFinish(input, 125_000, 0.5, recurrentBytes, true, 40, 12, schedule); // as measured
 * ```
 */
// KV pages leave in FIFO order: the cached prefix at once, then one page per computed chunk,
// and, with layer capture, `capturedBytes` released while the last chunk computes, with the
// last chunk's page among them when `lastPageCaptured` (a hybrid model's capture exports it
// once the last attention layer has written, before the chunk's later layers finish). The
// last byte leaves at max over release points r of (r + bytes released from r on / bw), with
// the link starting once the reservation round trip is done. Pages are released at chunk ends
// (between them the function is linear, so the ends are exact), the captured bytes at their
// own points:
// - `capturedPieces` P > 0: P equal pieces (one per recurrent layer, the captured page shared
//   among them) spread evenly, the k-th at k/P of the last chunk less `lastPieceLeadMs` (the
//   compute after the last recurrent layer, measured: HandoffCosts.captureLeadMs), so the last
//   leaves that much before compute end and the rest of its send time stays on the tail;
// - `schedule`: each piece where the pair's handoffs measured it (a hybrid model's layers come
//   in groups, the attention layers between them taking longer the deeper the prompt, so the
//   last group can leave more bytes to the tail than an even spread would);
// - neither: an even, continuous release over the last chunk.
export function streamFinish(
  i: StreamInput,
  bwPerMs: number,
  rttMs: number,
  capturedBytes = 0,
  lastPageCaptured = false,
  capturedPieces = 0,
  lastPieceLeadMs = 0,
  schedule?: CaptureSchedule,
): StreamFinish {
  const kv = i.state.kvBytesPerToken;
  const cached = i.prefillerCachedTokens ?? 0;
  const { computed, n, firstTokens, lastTokens, prefillMs, lastChunkMs, earlyTps, tokensAfter } =
    chunkTimes(i);
  const firstChunkMs = firstTokens / earlyTps;
  const cachedBytes = cached * kv;
  const lastPageBytes = n === 0 ? Math.min(cachedBytes, i.chunkTokens * kv) : lastTokens * kv;
  const totalBytes = cachedBytes + computed * kv;
  // Nothing computes: nothing to capture.
  const pageInCapture = n > 0 && lastPageCaptured ? lastPageBytes : 0;
  const captured = n === 0 ? 0 : capturedBytes + pageInCapture;
  const releases = _captureReleases(captured, prefillMs, lastChunkMs, {
    pieces: capturedPieces,
    leadMs: lastPieceLeadMs,
    schedule,
  });
  let finishMs = rttMs + ((i.knownBytes ?? 0) + totalBytes - pageInCapture + captured) / bwPerMs;
  // Chunk j (1..n) ends at its tokens at the early chunks' rate; at that point its page and
  // every later one, and the captured bytes not yet released (all of them before the last
  // chunk's end; at it, the pieces released then), are to leave.
  for (let j = 1; j <= n; j++) {
    const atMs = j === n ? prefillMs : tokensAfter(j) / earlyTps;
    const pagesFrom = (computed - tokensAfter(j - 1)) * kv - pageInCapture;
    const capturedLeft = j < n
      ? captured
      : releases.filter(([at]) => at >= prefillMs).reduce((a, [, b]) => a + b, 0);
    finishMs = Math.max(finishMs, atMs + (pagesFrom + capturedLeft) / bwPerMs);
  }
  // Each piece released before compute end, with every later piece and the last page after it.
  let after = lastPageBytes - pageInCapture;
  for (let k = releases.length - 1; k >= 0; k--) {
    const [atMs, bytes] = releases[k];
    after += bytes;
    if (atMs < prefillMs) finishMs = Math.max(finishMs, atMs + after / bwPerMs);
  }
  const nonLastBytes = totalBytes - (n === 0 ? 0 : lastPageBytes);
  let overlapFraction: number | null = null;
  if (n >= 1 && nonLastBytes > 0) {
    const sent = Math.min(
      nonLastBytes,
      // The known bytes go first: the pages get the rest of the link's time.
      bwPerMs * Math.max(0, prefillMs - rttMs) - (i.knownBytes ?? 0),
      n >= 2 ? cachedBytes + bwPerMs * (prefillMs - firstChunkMs) : Infinity,
      n >= 2 ? tokensAfter(n - 2) * kv + cachedBytes + bwPerMs * lastChunkMs : Infinity,
    );
    overlapFraction = Math.max(0, sent) / nonLastBytes;
  }
  return {
    prefillMs,
    uncoveredMs: Math.max(0, finishMs - prefillMs),
    lastPageBytes,
    overlapFraction,
  };
}

/**
 * The captured bytes' release points, [ms, bytes] in time order (empty: a continuous release,
 * or nothing captured): the pieces at the schedule's points, or spread evenly.
 */
function _captureReleases(
  captured: number,
  prefillMs: number,
  lastChunkMs: number,
  o: { pieces: number; leadMs: number; schedule?: CaptureSchedule },
): [number, number][] {
  if (captured <= 0) return [];
  const s = o.schedule ?? [];
  const shares = s.reduce((a, [, share]) => a + Math.max(0, share), 0);
  if (s.length > 0 && shares > 0) {
    return s
      .map(([f, share]): [number, number] => [
        prefillMs - Math.min(1, Math.max(0, f)) * lastChunkMs,
        (captured * Math.max(0, share)) / shares,
      ])
      .sort((a, b) => a[0] - b[0]);
  }
  if (o.pieces <= 0) return [];
  // The pieces are released over the last chunk less the lead (never before the chunk starts).
  const lead = Math.min(Math.max(0, o.leadMs), lastChunkMs);
  const startMs = prefillMs - lastChunkMs;
  return Array.from({ length: o.pieces }, (_, k): [number, number] => [
    startMs + ((lastChunkMs - lead) * (k + 1)) / o.pieces,
    captured / o.pieces,
  ]);
}
