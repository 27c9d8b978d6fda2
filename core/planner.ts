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
import { DEFAULT_STATE_BOUNDS, TOKEN_BYTES } from "./schema.ts";
import { streamFinish } from "./link_stream.ts";
import { linkResidualAt } from "./link_costs.ts";

/** State sizes of the model as measured from runtime export (not assumed). */
export interface StateSize {
  /** Attention KV bytes per prompt token (all attention layers, K and V). */
  kvBytesPerToken: number;
  /** Fixed recurrent bytes (conv + SSM of all recurrent layers). */
  recurrentBytes: number;
  /** Fixed sliding-window cache bytes (ISWA models). */
  swaBytes?: number;
  /** MTP draft context KV bytes per token. */
  mtpBytesPerToken?: number;
  /** Fixed MTP bytes (the pending hidden row). */
  mtpFixedBytes?: number;
}

/** A link measurement and how old it is. */
export interface LinkMeasurement {
  bandwidthBytesPerS: number;
  rttMs: number;
  ageMs: number;
  /** Lost pings over pings sent (null or absent: not measured). */
  lossFraction?: number | null;
  /** Why the estimator considers the link degraded (a drop, a rise); absent: it does not. */
  degraded?: string | null;
}

/** Capability, identity and certification facts the coordinator gathered. */
export interface PlanFlags {
  prefillerHasPrefillRole: boolean;
  decoderHasDecodeRole: boolean;
  /** Both peers advertise this build's state schema version. */
  schemaShared: boolean;
  /** `compareIdentity` found no mismatch. */
  identityMatch: boolean;
  /** The model family has passed the exact state-handoff gate. */
  familyCertified: boolean;
}

/** Everything `plan` weighs. */
export interface PlanInput {
  promptTokens: number;
  /** Prompt tokens the prefiller restores from its exact-prefix cache. */
  prefillerCachedTokens?: number;
  state: StateSize;
  link: LinkMeasurement | null;
  prefillerPrefillTokensPerS: number;
  decoderPrefillTokensPerS: number;
  /** Time the request would wait for the prefiller (contention), in ms. */
  prefillerQueueMs?: number;
  decoderFreeBytes: number;
  /** Prompt tokens per prefill chunk (one KV page each). */
  chunkTokens: number;
  flags: PlanFlags;
  /** Optional layer-split alternative: its prefill rate and the per-token hop it adds. */
  layerSplit?: { prefillTokensPerS: number; hopMsPerToken: number; outputTokens: number };
  /**
   * Decoder time to recompute the MTP draft state instead of receiving it; the tail takes
   * the cheaper of the two (absent: the MTP state is always sent).
   */
  mtpReprimeMs?: number;
  /** Decoder's continuation probe (one decode step) before CommitAck, in ms (absent: 0). */
  probeMs?: number;
  /**
   * The recurrent state (conv + SSM) leaves layer by layer while the last chunk computes (the
   * prefill worker's layer capture, ffi/layer_capture.ts), so it joins the page stream during
   * the last chunk instead of after it. Absent: false (it is sent after prefill ends).
   */
  snapshotDuringLastChunk?: boolean;
  /**
   * With `snapshotDuringLastChunk`, in a model with attention layers: the capture also sends
   * the last chunk's KV page before that chunk ends (once the last attention layer has written
   * it), and the decoder imports it on arrival. Absent: false (it leaves after prefill ends).
   */
  lastPageDuringLastChunk?: boolean;
  /** Tail costs measured on served handoffs (core/link_costs.ts); absent: the options' rates. */
  costs?: HandoffCosts;
}

/** Tail costs the nodes measured on handoffs they served, each with its unit last. */
export interface HandoffCosts {
  /**
   * Decoder: milliseconds per MiB of the import that could not overlap the wire (the last page
   * and the snapshot, at commit). Replaces `importBytesPerS`; 0 when staging hid it all.
   */
  importMsPerMiB?: number;
  /**
   * Prefiller: prefill end to the manifest leaving when the link is not what it waits for
   * (the tail export and its own probe step, which the manifest carries). The bytes flow
   * meanwhile, so the tail waits for the later of the two.
   */
  prefillerPostMs?: number;
  /**
   * Link: what the tail's link part took beyond the model's `bytes / bandwidth` (or the
   * prefiller's tail export, if later) and one RTT, on served handoffs, each with the RTT it
   * was measured at: the transfer right after compute end runs slower than a continuous probe
   * (the congestion window regrowing for the burst left then, frame handling on both ends).
   * Predicted as the median of the samples measured at an RTT within a factor of 2 of the
   * link's (all samples where none is), never below 0.
   */
  linkResidual?: { samples: [rttMs: number, ms: number][] };
  /**
   * Decoder: how long its probe result waited for the prefiller's probe digest before
   * CommitAck. The prefiller runs its own probe decode (its first decode after the last
   * chunk) once the manifest has left; where the manifest arrives quickly and that decode is
   * slower than the decoder's import and probe, CommitAck waits for it.
   */
  probeWaitMs?: number;
}

/** Thresholds, each with its unit last. */
export interface PlanOptions {
  promptTokensMin: number;
  linkAgeMsMax: number;
  bandwidthBytesPerSMin: number;
  rttMsMax: number;
  /** Ping loss above this refuses the link (loss collapses QUIC throughput). */
  lossFractionMax: number;
  /** Disaggregation must win by at least this much. */
  benefitMsMin: number;
  /**
   * And by at least this fraction of the colocated time (as must a layer split): node rates
   * measured on a loaded machine move by several percent between requests, so a smaller
   * predicted win is a coin toss (two workers of one speed, measured side by side: a predicted
   * win of 3.5%, a measured one of 0.3%).
   */
  benefitFractionMin: number;
  /** Decoder memory kept free beyond the state. */
  memoryHeadroomBytes: number;
  /** Decoder import rate for the tail (last page + snapshot). */
  importBytesPerS: number;
  stateBytesMax: number;
}

export const DEFAULT_PLAN_OPTIONS: Readonly<PlanOptions> = {
  promptTokensMin: 2048,
  linkAgeMsMax: 30_000,
  bandwidthBytesPerSMin: 125_000_000, // 1 Gb/s
  rttMsMax: 10,
  lossFractionMax: 0.0005,
  benefitMsMin: 20,
  benefitFractionMin: 0.1,
  memoryHeadroomBytes: 256 * 1024 * 1024,
  importBytesPerS: 2_000_000_000,
  stateBytesMax: DEFAULT_STATE_BOUNDS.stateBytesMax,
};

export type Placement = "colocated" | "disaggregated" | "layer-split";

/** Why a placement was or was not chosen. `code` is machine-readable. */
export interface PlanReason {
  code:
    | "prompt-too-short"
    | "capability-missing"
    | "identity-mismatch"
    | "not-certified"
    | "no-link-measurement"
    | "link-stale"
    | "link-too-slow"
    | "rtt-too-high"
    | "link-lossy"
    | "link-degraded"
    | "decoder-memory"
    | "state-too-large"
    | "slower-than-recompute"
    | "no-node-rates"
    | "chosen";
  message: string;
}

/** The numbers behind a plan, in bytes and milliseconds. */
export interface PlanEstimates {
  kvBytes: number;
  snapshotBytes: number;
  stateBytes: number;
  prefillerPrefillMs: number;
  uncoveredKvMs: number;
  snapshotTransferMs: number;
  mtpTransferMs: number;
  importMs: number;
  /** The prefiller's own work after prefill end beyond the transfer (0: the link is later). */
  manifestWaitMs?: number;
  /** The measured link residual at this RTT (HandoffCosts.linkResidual; 0 without one). */
  linkResidualMs?: number;
  commitRoundTripMs: number;
  handoffTailMs: number;
  disaggregatedMs: number;
  colocatedMs: number;
  layerSplitMs: number | null;
  benefitMs: number;
  /** Estimated share of the non-last KV bytes sent before prefill ends (null: one chunk). */
  overlapFraction: number | null;
  /** Whether the MTP state travels, is recomputed on the decoder, or does not exist. */
  mtpMode?: "transfer" | "reprime" | "none";
  /** The decoder's continuation probe inside the tail (0 when not given). */
  probeMs?: number;
  /** The decoder's measured wait for the prefiller's probe digest (HandoffCosts; 0 without). */
  probeWaitMs?: number;
  /** Prefill end to CommitAck as the prefiller sees it: `handoffTailMs + probeMs + probeWaitMs`. */
  commitTailMs?: number;
  /** Prefiller queue wait (contention) counted against the benefit. */
  prefillerQueueMs?: number;
}

export interface Plan {
  placement: Placement;
  reasons: PlanReason[];
  /** Null when there is no link measurement to estimate with. */
  estimates: PlanEstimates | null;
}

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
  ];
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
        `link loses ${
          ((link.lossFraction ?? 0) * 100).toFixed(2)
        }% of pings, over lossFractionMax ${(o.lossFractionMax * 100).toFixed(2)}%`,
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
  const bwPerMs = link.bandwidthBytesPerS / 1000;
  // With layer capture the recurrent bytes, and in a hybrid model the last page, share the
  // stream during the last chunk.
  const captured = i.snapshotDuringLastChunk ? i.state.recurrentBytes : 0;
  const pageCaptured = captured > 0 && i.state.kvBytesPerToken > 0 &&
    i.lastPageDuringLastChunk === true;
  const stream = streamFinish(i, bwPerMs, link.rttMs, 0, pageCaptured);
  const mtpBytes = _mtpBytes(i.state, i.promptTokens);
  const mtpSendMs = mtpBytes / bwPerMs + (mtpBytes / o.importBytesPerS) * 1000;
  const reprime = mtpBytes > 0 && i.mtpReprimeMs !== undefined && i.mtpReprimeMs < mtpSendMs;
  const mtpMode = mtpBytes === 0 ? "none" : reprime ? "reprime" : "transfer";
  const snapshotBytes = snapshotBytesFor(i.state, i.promptTokens) - (reprime ? mtpBytes : 0);
  const kvBytes = i.promptTokens * i.state.kvBytesPerToken;
  // What the captured bytes add is the combined stream's finish less the pages' own, and the
  // rest follows at the rate. A captured last page is imported on arrival, before the end.
  const snapshotTransferMs =
    (captured > 0
      ? streamFinish(i, bwPerMs, link.rttMs, captured, pageCaptured).uncoveredMs -
        stream.uncoveredMs
      : 0) + (snapshotBytes - captured) / bwPerMs;
  const importBytes = (pageCaptured ? 0 : stream.lastPageBytes) + snapshotBytes;
  const importMs =
    (i.costs?.importMsPerMiB !== undefined
      ? (importBytes / 2 ** 20) * i.costs.importMsPerMiB
      : (importBytes / o.importBytesPerS) * 1000) + (reprime ? i.mtpReprimeMs! : 0);
  const linkMs = stream.uncoveredMs + snapshotTransferMs;
  const manifestWaitMs = Math.max(0, (i.costs?.prefillerPostMs ?? 0) - linkMs);
  const linkResidualMs = linkResidualAt(i.costs?.linkResidual?.samples ?? [], link.rttMs);
  const handoffTailMs = linkMs + manifestWaitMs + linkResidualMs + importMs + link.rttMs;
  const probeMs = i.probeMs ?? 0;
  const probeWaitMs = i.costs?.probeWaitMs ?? 0;
  const disaggregatedMs = (i.prefillerQueueMs ?? 0) + stream.prefillMs + handoffTailMs;
  const colocatedMs = _colocatedMs(i);
  const ls = i.layerSplit;
  return {
    kvBytes,
    snapshotBytes,
    stateBytes: kvBytes + snapshotBytes,
    prefillerPrefillMs: stream.prefillMs,
    uncoveredKvMs: stream.uncoveredMs,
    snapshotTransferMs,
    mtpTransferMs: reprime ? 0 : mtpBytes / bwPerMs,
    importMs,
    manifestWaitMs,
    linkResidualMs,
    commitRoundTripMs: link.rttMs,
    handoffTailMs,
    disaggregatedMs,
    colocatedMs,
    layerSplitMs: ls
      ? (i.promptTokens / ls.prefillTokensPerS) * 1000 + ls.outputTokens * ls.hopMsPerToken
      : null,
    benefitMs: colocatedMs - disaggregatedMs,
    overlapFraction: stream.overlapFraction,
    mtpMode,
    probeMs,
    probeWaitMs,
    commitTailMs: handoffTailMs + probeMs + probeWaitMs,
    prefillerQueueMs: i.prefillerQueueMs ?? 0,
  };
}

function _ms(ms: number): string {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function _rate(bytesPerS: number): string {
  return `${((bytesPerS * 8) / 1e9).toFixed(2)} Gb/s`;
}
