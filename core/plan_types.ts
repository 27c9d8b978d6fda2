/**
 * What the planner (core/planner.ts) takes and returns: the request's state sizes, the link
 * measurement, node rates and measured tail costs in; the placement, its reasons and the
 * estimates behind it out; and the options with their defaults, each named with its unit.
 *
 * @module
 */
import { DEFAULT_STATE_BOUNDS } from "./schema.ts";
import type { CaptureSchedule } from "./link_stream.ts";

/** State sizes of the model as measured from runtime export (not assumed). */
export interface StateSize {
  /** Attention KV bytes per prompt token (all attention layers, K and V). */
  kvBytesPerToken: number;
  /** Fixed recurrent bytes (conv + SSM of all recurrent layers). */
  recurrentBytes: number;
  /**
   * Recurrent layers the fixed bytes split into (absent: the captured state is modelled as an
   * even, continuous release). With layer capture the last layer's piece leaves at compute end.
   */
  recurrentLayers?: number;
  /** Fixed sliding-window cache bytes (ISWA models). */
  swaBytes?: number;
  /** MTP draft context KV bytes per token. */
  mtpBytesPerToken?: number;
  /** Fixed MTP bytes (the pending hidden row). */
  mtpFixedBytes?: number;
}

/**
 * One served handoff's link residual: the RTT (ms) and rate (bytes/s; null: not measured)
 * the prediction used, what the link part took beyond the model (ms), and the prompt's tokens
 * (absent or null: not recorded).
 */
export type LinkResidualSample = [
  rttMs: number,
  ms: number,
  bytesPerS?: number | null,
  promptTokens?: number | null,
];

/** A link measurement and how old it is. */
export interface LinkMeasurement {
  bandwidthBytesPerS: number;
  rttMs: number;
  ageMs: number;
  /**
   * Lost over sent: datagrams of the loss probes, or pings without one (null or absent: not
   * measured).
   */
  lossFraction?: number | null;
  /** What `lossFraction` counts: "datagrams", "pings" or "stated" (a figure given, as to `plan`). */
  lossSource?: "datagrams" | "pings" | "stated" | null;
  /**
   * The rate the pair's handoffs' last large frames arrived at (LinkEstimate.tailBytesPerS),
   * at which what is still queued at prefill end drains; null or absent: not measured, the
   * transfer rate throughout.
   */
  tailBytesPerS?: number | null;
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
  /**
   * The prefiller's rate over the last chunk alone (absent: the average). Deeper tokens cost
   * more, so the last chunk, during which the recurrent state leaves, takes longer than an
   * average one, and the chunks before it less.
   */
  prefillerLastChunkTokensPerS?: number;
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
  /**
   * The congestion controller the prefill worker sends the state with (its capabilities).
   * Cubic slows for every loss, so over a lossy link the state moves at no more than the
   * loss-limited rate; BBR paces at the bottleneck rate it measures and does not slow for
   * random loss, so it moves at the link's measured rate. Absent: "cubic".
   */
  congestionControl?: CongestionControl;
  /** Tail costs measured on served handoffs (core/link_costs.ts); absent: the options' rates. */
  costs?: HandoffCosts;
}

/**
 * A QUIC sender's congestion controller: "cubic" (Deno's default, best on clean fast links)
 * or "bbr" (holds its rate under random loss).
 */
export type CongestionControl = "cubic" | "bbr";

/** The controllers a node can send with, for option parsing and messages. */
export const CONGESTION_CONTROLS: readonly CongestionControl[] = ["cubic", "bbr"];

/** A node's setting: one controller for every link, or `auto` (chosen per link from its loss). */
export type CongestionControlMode = CongestionControl | "auto";

export const CONGESTION_CONTROL_MODES: readonly CongestionControlMode[] = ["auto", "cubic", "bbr"];

/**
 * The controller a link starts with under `mode` (and keeps, unless `auto` changes it): `auto`
 * starts with Cubic.
 */
export function startingController(mode: CongestionControlMode | undefined): CongestionControl {
  return mode === "bbr" ? "bbr" : "cubic";
}

/** Tail costs the nodes measured on handoffs they served, each with its unit last. */
export interface HandoffCosts {
  /**
   * Decoder: milliseconds per MiB of the import that could not overlap the wire (the last page
   * and the snapshot, at commit). Replaces `importBytesPerS`; 0 when staging hid it all.
   */
  importMsPerMiB?: number;
  /**
   * Decoder: the rest of its commit, besides that import, its probe and the probe digest wait:
   * the manifest's tag and hashes checked against what was staged, and the commit itself.
   */
  validateMs?: number;
  /**
   * Prefiller: prefill end to the manifest leaving when the link is not what it waits for
   * (the tail export and its own probe step, which the manifest carries). The bytes flow
   * meanwhile, so the tail waits for the later of the two.
   */
  prefillerPostMs?: number;
  /**
   * Prefiller, with layer capture: milliseconds between the last recurrent layer's capture and
   * compute end (the layers and output after it, the first token's sampling). The last layer's
   * piece leaves that much before compute end; 0 when absent (it leaves at compute end).
   */
  captureLeadMs?: number;
  /**
   * Prefiller, with layer capture: when each captured piece was released, as [share of the
   * last chunk's compute before its end, share of the captured bytes] (core/link_stream.ts
   * `CaptureSchedule`), as the pair's newest handoff measured it. The layers do not leave
   * evenly: a hybrid model's attention layers sit between groups of them, and their cost grows
   * with depth. Absent: an even spread over the last chunk (less `captureLeadMs`).
   */
  captureSchedule?: CaptureSchedule;
  /**
   * Link: what the tail's link part took beyond the model's `bytes / bandwidth` (or the
   * prefiller's tail export, if later) and one RTT, on served handoffs, each with the RTT and
   * rate it was measured at: the transfer right after compute end runs slower than a continuous
   * probe (the congestion window regrowing for the burst left then, frame handling on both
   * ends). Predicted as the median of the samples measured on a similar link, from a prompt of
   * similar depth where there are any (`linkResidualAt`, core/link_costs.ts), never below 0.
   */
  linkResidual?: { samples: LinkResidualSample[] };
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
  /**
   * K in a loss-limited sender's rate, K / (RTT x sqrt(p)) bytes/s at loss-event rate p
   * (Mathis et al., 1997; QUIC's Cubic keeps to it in its Reno-friendly region): the bytes per
   * round trip it averages at unit loss, of the order of one full datagram. Bounds the rate of
   * a lossy link, which a short probe reads before its first loss.
   */
  lossResponseBytes: number;
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
  lossResponseBytes: 2_000, // bench/cc_bench.ts: docs/bench-report/link-matrix/FINDINGS.md
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
  /**
   * The link rate the transfer terms use: the measured one, or where the link loses and the
   * loss-limited rate is lower, that (bytes/s).
   */
  linkBytesPerS: number;
  /** Whether `linkBytesPerS` is the loss-limited rate. */
  lossLimited: boolean;
  /**
   * The rate what is still queued at prefill end drains at (bytes/s): the measured tail rate
   * where there is one (LinkMeasurement.tailBytesPerS), else `linkBytesPerS`.
   */
  tailBytesPerS: number;
  kvBytes: number;
  snapshotBytes: number;
  stateBytes: number;
  prefillerPrefillMs: number;
  uncoveredKvMs: number;
  snapshotTransferMs: number;
  mtpTransferMs: number;
  importMs: number;
  /** The decoder's validate and commit besides the import (HandoffCosts.validateMs; 0 without). */
  validateMs?: number;
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
  /**
   * The decoder's part of that tail, manifest received to CommitAck sent (telemetry's
   * `commitMs`): `importMs + validateMs + probeMs + probeWaitMs`.
   */
  decoderCommitMs: number;
  /** Prefiller queue wait (contention) counted against the benefit. */
  prefillerQueueMs?: number;
}

export interface Plan {
  placement: Placement;
  reasons: PlanReason[];
  /** Null when there is no link measurement to estimate with. */
  estimates: PlanEstimates | null;
}
