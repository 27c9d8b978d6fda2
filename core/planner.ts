/**
 * Cost-based placement: should this request be prefilled on the decoder itself (colocated),
 * on a prefill worker with the state streamed over (disaggregated), or across a layer split?
 *
 * The model follows the design note: KV pages stream while later chunks compute, so only
 * what the link could not hide stays on the *handoff tail*:
 *
 *     handoff_tail = uncovered KV transfer + final snapshot (recurrent, SWA, MTP) transfer
 *                  + import + one commit round trip
 *
 * With the prefill worker's layer capture the recurrent state joins the page stream during the
 * last chunk (`snapshotDuringLastChunk`), and the fixed costs (the decoder's probe, the import
 * left at commit, the prefiller's work before the manifest) come from served handoffs
 * (`costs`, core/link_costs.ts); the manifest leaves at the later of the link and that work.
 *
 * Disaggregation is chosen only when every eligibility check passes and the prefiller's
 * prefill plus the tail beats the decoder recomputing the prompt by `benefitMsMin` and by
 * `benefitFractionMin` of the recompute.
 * Numbers are estimates for a single request; measured values replace them in `bench/`.
 *
 * @module
 */
import { UsageError } from "./errors.ts";
import { TOKEN_BYTES } from "./schema.ts";
import { chunkTimes, streamFinish } from "./link_stream.ts";
import { linkResidualAt } from "./link_costs.ts";
import {
  DEFAULT_PLAN_OPTIONS,
  type LinkMeasurement,
  type Placement,
  type Plan,
  type PlanEstimates,
  type PlanInput,
  type PlanOptions,
  type PlanReason,
  type StateSize,
} from "./plan_types.ts";

export * from "./plan_types.ts";

/**
 * Total state bytes of a handoff of `tokens` prompt tokens (KV, snapshot, history).
 *
 * @example
 * ```ts
 * stateBytesFor({ kvBytesPerToken: 8192, recurrentBytes: 160 << 20 }, 32768); // ~416 MiB
 * ```
 */
export function stateBytesFor(state: StateSize, tokens: number): number {
  return tokens * state.kvBytesPerToken + snapshotBytesFor(state, tokens);
}

/** Bytes that travel after the last page: recurrent, SWA, MTP and the token history. */
export function snapshotBytesFor(state: StateSize, tokens: number): number {
  return state.recurrentBytes + (state.swaBytes ?? 0) + _mtpBytes(state, tokens) +
    tokens * TOKEN_BYTES;
}

function _mtpBytes(state: StateSize, tokens: number): number {
  return (state.mtpBytesPerToken ?? 0) * tokens + (state.mtpFixedBytes ?? 0);
}

/**
 * Chooses a placement and explains it.
 *
 * @example
 * ```ts
 * const p = plan({ promptTokens: 32768, state, link, chunkTokens: 2048, ... });
 * if (p.placement === "disaggregated") startHandoff();
 * console.log(p.reasons.map((r) => r.message).join("; "));
 * ```
 */
export function plan(input: PlanInput, options: Partial<PlanOptions> = {}): Plan {
  const o: PlanOptions = { ...DEFAULT_PLAN_OPTIONS, ...options };
  _checkInput(input);
  const reasons = _eligibility(input, o);
  const estimates = input.link ? estimate(input, input.link, o) : null;
  if (estimates) reasons.push(..._economics(estimates, o));
  const disaggOk = reasons.length === 0;
  const ls = estimates?.layerSplitMs ?? null;
  const linkUsable = input.link !== null &&
    !reasons.some((r) => r.code.startsWith("link") || r.code === "rtt-too-high");
  const colocatedMs = estimates?.colocatedMs ?? _colocatedMs(input);
  let placement: Placement = "colocated";
  if (disaggOk && estimates && (ls === null || estimates.disaggregatedMs <= ls)) {
    placement = "disaggregated";
  } else if (ls !== null && linkUsable && colocatedMs - ls > _benefitRequiredMs(colocatedMs, o)) {
    placement = "layer-split";
  }
  const chosen = `${placement} chosen` +
    (estimates
      ? ` (colocated ${_ms(colocatedMs)}, disaggregated ${_ms(estimates.disaggregatedMs)}${
        ls === null ? "" : `, layer-split ${_ms(ls)}`
      })`
      : "");
  return { placement, reasons: [...reasons, { code: "chosen", message: chosen }], estimates };
}

function _checkInput(i: PlanInput): void {
  const positive: [string, number][] = [
    ["promptTokens", i.promptTokens],
    ["chunkTokens", i.chunkTokens],
    ["prefillerPrefillTokensPerS", i.prefillerPrefillTokensPerS],
    ["decoderPrefillTokensPerS", i.decoderPrefillTokensPerS],
  ];
  const nonNegative: [string, number][] = [
    ["prefillerCachedTokens", i.prefillerCachedTokens ?? 0],
    ["prefillerQueueMs", i.prefillerQueueMs ?? 0],
    ["mtpReprimeMs", i.mtpReprimeMs ?? 0],
    ["probeMs", i.probeMs ?? 0],
    ["decoderFreeBytes", i.decoderFreeBytes],
    ["kvBytesPerToken", i.state.kvBytesPerToken],
    ["recurrentBytes", i.state.recurrentBytes],
    ["costs.captureLeadMs", i.costs?.captureLeadMs ?? 0],
  ];
  if (i.prefillerLastChunkTokensPerS !== undefined) {
    positive.push(["prefillerLastChunkTokensPerS", i.prefillerLastChunkTokensPerS]);
  }
  for (const [name, v] of positive) {
    if (!(Number.isFinite(v) && v > 0)) {
      throw new UsageError(`Invalid plan input ${name} ${v}: must be positive`);
    }
  }
  for (const [name, v] of nonNegative) {
    if (!(Number.isFinite(v) && v >= 0)) {
      throw new UsageError(`Invalid plan input ${name} ${v}: must be 0 or more`);
    }
  }
  const layers = i.state.recurrentLayers ?? 0;
  if (!(Number.isInteger(layers) && layers >= 0)) {
    throw new UsageError(`Invalid plan input recurrentLayers ${layers}: must be a whole number`);
  }
  if ((i.prefillerCachedTokens ?? 0) > i.promptTokens) {
    throw new UsageError("Invalid plan input: more cached tokens than prompt tokens");
  }
}

function _eligibility(i: PlanInput, o: PlanOptions): PlanReason[] {
  const out: PlanReason[] = [];
  const add = (code: PlanReason["code"], message: string) => out.push({ code, message });
  if (i.promptTokens < o.promptTokensMin) {
    add(
      "prompt-too-short",
      `prompt of ${i.promptTokens} tokens is under promptTokensMin ${o.promptTokensMin}`,
    );
  }
  const f = i.flags;
  if (!f.prefillerHasPrefillRole) {
    add("capability-missing", "prefiller does not advertise the prefill role");
  }
  if (!f.decoderHasDecodeRole) {
    add("capability-missing", "decoder does not advertise the decode role");
  }
  if (!f.schemaShared) add("capability-missing", "peers share no state schema version");
  if (!f.identityMatch) add("identity-mismatch", "numerical identities differ");
  if (!f.familyCertified) {
    add("not-certified", "model family has no exact state-handoff certification");
  }
  const link = i.link;
  if (!link) {
    add("no-link-measurement", "no bandwidth/RTT measurement for this link");
  } else {
    if (link.ageMs > o.linkAgeMsMax) {
      add(
        "link-stale",
        `link measurement is ${_ms(link.ageMs)} old, over linkAgeMsMax ${o.linkAgeMsMax}`,
      );
    }
    if (!(link.bandwidthBytesPerS >= o.bandwidthBytesPerSMin)) {
      add(
        "link-too-slow",
        `link at ${_rate(link.bandwidthBytesPerS)} is under ${_rate(o.bandwidthBytesPerSMin)}`,
      );
    }
    if (!(link.rttMs <= o.rttMsMax)) {
      add("rtt-too-high", `RTT ${_ms(link.rttMs)} is over rttMsMax ${o.rttMsMax}`);
    }
    if ((link.lossFraction ?? 0) > o.lossFractionMax) {
      add(
        "link-lossy",
        `link loses ${((link.lossFraction ?? 0) * 100).toFixed(2)}%${
          link.lossSource === "datagrams"
            ? " of the loss probe's datagrams"
            : link.lossSource === "pings"
            ? " of pings"
            : ""
        }, over lossFractionMax ${(o.lossFractionMax * 100).toFixed(2)}%`,
      );
    }
    if (link.degraded) add("link-degraded", `link degraded: ${link.degraded}`);
  }
  const bytes = stateBytesFor(i.state, i.promptTokens);
  if (bytes > o.stateBytesMax) {
    add("state-too-large", `state of ${bytes} bytes exceeds stateBytesMax ${o.stateBytesMax}`);
  }
  if (bytes + o.memoryHeadroomBytes > i.decoderFreeBytes) {
    add(
      "decoder-memory",
      `state of ${bytes} bytes plus headroom does not fit the decoder's ${i.decoderFreeBytes} free bytes`,
    );
  }
  return out;
}

/** What any placement other than colocated must win by: `benefitMsMin`, `benefitFractionMin`. */
function _benefitRequiredMs(colocatedMs: number, o: PlanOptions): number {
  return Math.max(o.benefitMsMin, o.benefitFractionMin * colocatedMs);
}

function _economics(e: PlanEstimates, o: PlanOptions): PlanReason[] {
  const byFraction = o.benefitFractionMin * e.colocatedMs;
  if (e.benefitMs >= _benefitRequiredMs(e.colocatedMs, o)) return [];
  const by = byFraction > o.benefitMsMin
    ? `benefitFractionMin ${o.benefitFractionMin} (${_ms(byFraction)})`
    : `benefitMsMin ${o.benefitMsMin}`;
  return [{
    code: "slower-than-recompute",
    message: `handoff (${_ms(e.disaggregatedMs)}, tail ${
      _ms(e.handoffTailMs)
    }) does not beat recompute on the decoder (${_ms(e.colocatedMs)}) by ${by}`,
  }];
}

function _colocatedMs(i: PlanInput): number {
  return (i.promptTokens / i.decoderPrefillTokensPerS) * 1000;
}

/**
 * The estimates behind `plan` for one link, without any eligibility decision.
 *
 * @example
 * ```ts
 * estimate(input, { bandwidthBytesPerS: 5e9, rttMs: 0.2, ageMs: 100 }).handoffTailMs;
 * ```
 */
export function estimate(
  i: PlanInput,
  link: LinkMeasurement,
  options: Partial<PlanOptions> = {},
): PlanEstimates {
  const o: PlanOptions = { ...DEFAULT_PLAN_OPTIONS, ...options };
  // With layer capture the recurrent bytes, and in a hybrid model the last page, share the
  // stream during the last chunk, one recurrent layer's piece at a time.
  const captured = i.snapshotDuringLastChunk ? i.state.recurrentBytes : 0;
  const pageCaptured = captured > 0 && i.state.kvBytesPerToken > 0 &&
    i.lastPageDuringLastChunk === true;
  const linkBytesPerS = _linkBytesPerS(i, link, o, captured);
  const bwPerMs = linkBytesPerS / 1000;
  // The token history is final before prefill: it leaves at its start, not in the tail.
  const known = { ...i, knownBytes: i.promptTokens * TOKEN_BYTES };
  const stream = streamFinish(known, bwPerMs, link.rttMs, 0, pageCaptured);
  const mtp = _mtpPlan(i, bwPerMs, o);
  const snapshotBytes = snapshotBytesFor(i.state, i.promptTokens) -
    (mtp.mode === "reprime" ? mtp.bytes : 0);
  const kvBytes = i.promptTokens * i.state.kvBytesPerToken;
  // Every byte is released by prefill end, so what the link has left then is a backlog, which
  // drains at the measured tail rate where there is one: the same FIFO's finish, its part past
  // prefill end times the ratio of the two rates (less a reservation round trip that ends
  // after prefill, which is a wait, not bytes).
  const tailBytesPerS = (link.tailBytesPerS ?? 0) > 0 ? link.tailBytesPerS! : linkBytesPerS;
  const drain = linkBytesPerS / tailBytesPerS;
  const waitMs = Math.max(0, link.rttMs - stream.prefillMs);
  const uncoveredKvMs = waitMs + (stream.uncoveredMs - waitMs) * drain;
  // What the captured bytes add is the combined stream's finish less the pages' own, and the
  // rest follows at the rate. A captured last page is imported on arrival, before the end.
  const snapshotTransferMs = drain *
    ((captured > 0
      ? _combinedUncoveredMs(known, bwPerMs, link.rttMs, captured, pageCaptured) -
        stream.uncoveredMs
      : 0) + (snapshotBytes - known.knownBytes - captured) / bwPerMs);
  const importBytes = (pageCaptured ? 0 : stream.lastPageBytes) + snapshotBytes;
  const importMs = _importMs(i, o, importBytes) + (mtp.mode === "reprime" ? i.mtpReprimeMs! : 0);
  const linkMs = uncoveredKvMs + snapshotTransferMs;
  const manifestWaitMs = Math.max(0, (i.costs?.prefillerPostMs ?? 0) - linkMs);
  const linkResidualMs = linkResidualAt(
    i.costs?.linkResidual?.samples ?? [],
    link.rttMs,
    link.bandwidthBytesPerS,
    i.promptTokens,
  );
  const validateMs = i.costs?.validateMs ?? 0;
  const handoffTailMs = linkMs + manifestWaitMs + linkResidualMs + importMs + validateMs +
    link.rttMs;
  const probeMs = i.probeMs ?? 0;
  const probeWaitMs = i.costs?.probeWaitMs ?? 0;
  const disaggregatedMs = (i.prefillerQueueMs ?? 0) + stream.prefillMs + handoffTailMs;
  const colocatedMs = _colocatedMs(i);
  return {
    linkBytesPerS,
    lossLimited: linkBytesPerS < link.bandwidthBytesPerS,
    tailBytesPerS,
    kvBytes,
    snapshotBytes,
    stateBytes: kvBytes + snapshotBytes,
    prefillerPrefillMs: stream.prefillMs,
    uncoveredKvMs,
    snapshotTransferMs,
    mtpTransferMs: mtp.mode === "reprime" ? 0 : mtp.bytes / bwPerMs,
    importMs,
    validateMs,
    manifestWaitMs,
    linkResidualMs,
    commitRoundTripMs: link.rttMs,
    handoffTailMs,
    disaggregatedMs,
    colocatedMs,
    layerSplitMs: _layerSplitMs(i),
    benefitMs: colocatedMs - disaggregatedMs,
    overlapFraction: stream.overlapFraction,
    mtpMode: mtp.mode,
    probeMs,
    probeWaitMs,
    commitTailMs: handoffTailMs + probeMs + probeWaitMs,
    decoderCommitMs: importMs + validateMs + probeMs + probeWaitMs,
    prefillerQueueMs: i.prefillerQueueMs ?? 0,
  };
}

/**
 * The rate the state moves at. Over a lossy link a Cubic sender moves it at no more than the
 * loss-limited rate (a short probe reads the rate before its first loss), where it keeps the
 * link busy:
 * captured layers released more slowly than that leave one by one after idle gaps, in which the
 * congestion window grows back, at about the measured rate.
 */
function _linkBytesPerS(
  i: PlanInput,
  link: LinkMeasurement,
  o: PlanOptions,
  capturedBytes: number,
): number {
  // BBR paces at the bottleneck rate it measures; random loss does not slow it.
  if (i.congestionControl === "bbr") return link.bandwidthBytesPerS;
  const lossLimit = lossLimitedBytesPerS(link.rttMs, link.lossFraction ?? 0, o.lossResponseBytes);
  const { lastChunkMs } = chunkTimes(i);
  const releasedBytesPerS = capturedBytes > 0 && lastChunkMs > 0
    ? (capturedBytes / lastChunkMs) * 1000
    : Infinity;
  return releasedBytesPerS > lossLimit
    ? Math.min(link.bandwidthBytesPerS, lossLimit)
    : link.bandwidthBytesPerS;
}

/**
 * When the pages and the captured bytes finish together, past the end of prefill: the combined
 * stream shares the link during the last chunk, one recurrent layer's piece at a time.
 */
function _combinedUncoveredMs(
  i: PlanInput,
  bwPerMs: number,
  rttMs: number,
  capturedBytes: number,
  pageCaptured: boolean,
): number {
  const pieces = i.state.recurrentLayers ?? 0;
  const lead = i.costs?.captureLeadMs ?? 0;
  const schedule = i.costs?.captureSchedule;
  return streamFinish(i, bwPerMs, rttMs, capturedBytes, pageCaptured, pieces, lead, schedule)
    .uncoveredMs;
}

/** The MTP draft state: sent with the snapshot, or reprimed on the decoder where that is sooner. */
function _mtpPlan(
  i: PlanInput,
  bwPerMs: number,
  o: PlanOptions,
): { bytes: number; mode: PlanEstimates["mtpMode"] } {
  const bytes = _mtpBytes(i.state, i.promptTokens);
  if (bytes === 0) return { bytes, mode: "none" };
  const sendMs = bytes / bwPerMs + (bytes / o.importBytesPerS) * 1000;
  const reprime = i.mtpReprimeMs !== undefined && i.mtpReprimeMs < sendMs;
  return { bytes, mode: reprime ? "reprime" : "transfer" };
}

/** The decoder's import of these bytes: its measured cost per MiB, else `importBytesPerS`. */
function _importMs(i: PlanInput, o: PlanOptions, importBytes: number): number {
  return i.costs?.importMsPerMiB !== undefined
    ? (importBytes / 2 ** 20) * i.costs.importMsPerMiB
    : (importBytes / o.importBytesPerS) * 1000;
}

function _layerSplitMs(i: PlanInput): number | null {
  const ls = i.layerSplit;
  return ls
    ? (i.promptTokens / ls.prefillTokensPerS) * 1000 + ls.outputTokens * ls.hopMsPerToken
    : null;
}

/**
 * The rate a loss-limited sender averages over a link with this RTT and loss-event rate:
 * `lossResponseBytes / (RTT x sqrt(p))` bytes/s (Infinity without loss or RTT). With the default
 * K, over 10 ms and 0.1% loss about 6.3 MB/s whatever the line rate; over 0.2 ms, 316 MB/s.
 *
 * @example
 * ```ts
 * lossLimitedBytesPerS(10, 0.001, 2000); // ~6.3e6
 * ```
 */
export function lossLimitedBytesPerS(
  rttMs: number,
  lossFraction: number,
  lossResponseBytes: number,
): number {
  if (!(lossFraction > 0) || !(rttMs > 0)) return Infinity;
  return lossResponseBytes / ((rttMs / 1000) * Math.sqrt(lossFraction));
}

function _ms(ms: number): string {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function _rate(bytesPerS: number): string {
  return `${((bytesPerS * 8) / 1e9).toFixed(2)} Gb/s`;
}
