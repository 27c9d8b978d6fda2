/**
 * Per-request placement from live facts: the link estimate of the peer pair, both nodes'
 * measured rates, the prefiller's queue, the decoder's free memory, capabilities, identity
 * and the certification file, turned into a `plan()` call. The result carries the prediction
 * (TTFT and tail) so the handoff record can show it next to the measurement.
 *
 * Pure: the caller passes the estimator, its clock reading and the facts it gathered
 * (`serve/placement.ts` gathers them from a live PeerConnection).
 *
 * @module
 */
import type { CertificationFile } from "./certification.ts";
import { isCertified } from "./certification.ts";
import type { LinkEstimate, LinkEstimator } from "./link_estimates.ts";
import { type MeasuredHandoffCosts, probeMsAt } from "./link_costs.ts";
import { averagePrefillTokensPerS, msPerTokenAt, type NodeRates } from "./node_rates.ts";
import { lastChunkTokens } from "./link_stream.ts";
import {
  type CongestionControl,
  type HandoffCosts,
  type Plan,
  plan,
  type PlanInput,
  type PlanOptions,
  type StateSize,
} from "./planner.ts";

/** One side of a candidate handoff. */
export interface PlacementNode {
  nodeId: string;
  /** Null: the node reported no rates (and has no calibration): it cannot be planned for. */
  rates: NodeRates | null;
  /** The node advertises the role it would take (prefill for the prefiller, decode for the decoder). */
  hasRole: boolean;
}

/** Everything known about one request and its candidate pair. */
export interface PlacementRequest {
  promptTokens: number;
  prefillerCachedTokens?: number;
  prefiller: PlacementNode & { queueMs?: number };
  decoder: PlacementNode & { freeBytes: number };
  /** Both advertise a common state schema version. */
  schemaShared: boolean;
  /** Numerical identities equal (compared by the caller; never passed here). */
  identityMatch: boolean;
  /** The model's family and the llama.cpp build both run, for the certification lookup. */
  family: string;
  llamaBuild: string;
  state: StateSize;
  chunkTokens: number;
  /** The prefiller sends the recurrent state while the last chunk computes (layer capture). */
  snapshotDuringLastChunk?: boolean;
  /** ...and the last chunk's KV page before that chunk ends (PlanInput). */
  lastPageDuringLastChunk?: boolean;
  /** The prefiller's congestion controller for the state (PlanInput; absent: "cubic"). */
  congestionControl?: CongestionControl;
  /** Costs measured on the pair's served handoffs (core/link_costs.ts). */
  costs?: MeasuredHandoffCosts;
}

export interface PlacementContext {
  links: LinkEstimator;
  /** The caller's monotonic clock now (same clock as the samples). */
  nowMs: number;
  certification: CertificationFile | null;
  options?: Partial<PlanOptions>;
}

/** What the decision predicts, to be recorded beside the measurement. */
export interface PlacementPrediction {
  /** Client's first token, disaggregated: queue + prefill on the prefiller + measured overhead. */
  ttftDisaggregatedMs: number;
  /** Client's first token, colocated: the decoder prefilling itself. */
  ttftColocatedMs: number;
  /**
   * Prefill end to CommitAck on the prefiller: the handoff tail plus the probe step and the
   * measured wait for the prefiller's probe digest.
   */
  commitTailMs: number;
  /**
   * Prefill end to the last byte leaving, as the model has it (uncovered pages and the
   * snapshot's transfer): what a served handoff's link residual is measured against.
   */
  linkMs: number;
}

export interface PlacementDecision extends Plan {
  link: LinkEstimate | null;
  prediction: PlacementPrediction | null;
  /** Where each node's rates came from (printed, so placeholders never pass as measurements). */
  rateSources: { prefiller: string | null; decoder: string | null };
}

/**
 * Decides one request's placement.
 *
 * @example
 * ```ts
 * const d = placeRequest(request, { links, nowMs: performance.now(), certification });
 * if (d.placement === "disaggregated") await runHandoff(...);
 * record.prediction = d.prediction; // beside the measured telemetry
 * ```
 */
export function placeRequest(r: PlacementRequest, ctx: PlacementContext): PlacementDecision {
  const link = ctx.links.estimate({ from: r.prefiller.nodeId, to: r.decoder.nodeId }, ctx.nowMs);
  const rateSources = {
    prefiller: r.prefiller.rates ? _source(r.prefiller.rates) : null,
    decoder: r.decoder.rates ? _source(r.decoder.rates) : null,
  };
  if (!r.prefiller.rates || !r.decoder.rates) {
    const who = !r.prefiller.rates ? "prefiller" : "decoder";
    return {
      placement: "colocated",
      reasons: [
        {
          code: "no-node-rates",
          message: `${who} reported no prefill/decode rates (no measurement, no calibration)`,
        },
        { code: "chosen", message: "colocated chosen" },
      ],
      estimates: null,
      link,
      prediction: null,
      rateSources,
    };
  }
  const input = planInputFor(r, link, ctx.certification);
  const p = plan(input, ctx.options);
  const e = p.estimates;
  const prediction = e
    ? {
      ttftDisaggregatedMs: (e.prefillerQueueMs ?? 0) + e.prefillerPrefillMs +
        (r.costs?.firstTokenOverheadMs ?? 0),
      ttftColocatedMs: e.colocatedMs,
      commitTailMs: e.commitTailMs ?? e.handoffTailMs,
      linkMs: e.uncoveredKvMs + e.snapshotTransferMs,
    }
    : null;
  return { ...p, link, prediction, rateSources };
}

/** The `plan()` input for a request (exported for `cli/plan.ts` and the bench). */
export function planInputFor(
  r: PlacementRequest,
  link: LinkEstimate | null,
  certification: CertificationFile | null,
): PlanInput {
  const pr = r.prefiller.rates!, dr = r.decoder.rates!;
  const cached = r.prefillerCachedTokens ?? 0;
  const usable = link && link.bandwidthBytesPerS !== null && link.rttMs !== null;
  return {
    promptTokens: r.promptTokens,
    prefillerCachedTokens: cached,
    state: r.state,
    link: usable
      ? {
        bandwidthBytesPerS: link.bandwidthBytesPerS!,
        rttMs: link.rttMs!,
        ageMs: link.ageMs,
        lossFraction: link.lossFraction,
        lossSource: link.lossSource,
        tailBytesPerS: link.tailBytesPerS,
        degraded: link.degraded?.message ?? null,
      }
      : null,
    prefillerPrefillTokensPerS: cached < r.promptTokens
      ? averagePrefillTokensPerS(pr.prefill, r.promptTokens, cached)
      : averagePrefillTokensPerS(pr.prefill, r.promptTokens),
    prefillerLastChunkTokensPerS: _lastChunkTokensPerS(
      pr.prefill,
      r.promptTokens,
      cached,
      r.chunkTokens,
      r.snapshotDuringLastChunk ?? false,
    ),
    decoderPrefillTokensPerS: averagePrefillTokensPerS(dr.prefill, r.promptTokens),
    prefillerQueueMs: r.prefiller.queueMs ?? 0,
    decoderFreeBytes: r.decoder.freeBytes,
    chunkTokens: r.chunkTokens,
    // The pair's measured probes (a first decode in a fresh context) over the decode rate's step.
    probeMs: probeMsAt(r.costs?.probes ?? [], r.promptTokens, (d) => msPerTokenAt(dr.decode, d)) ??
      msPerTokenAt(dr.decode, r.promptTokens),
    snapshotDuringLastChunk: r.snapshotDuringLastChunk ?? false,
    lastPageDuringLastChunk: r.lastPageDuringLastChunk ?? false,
    congestionControl: r.congestionControl ?? "cubic",
    costs: handoffCostsOf(r.costs),
    flags: {
      prefillerHasPrefillRole: r.prefiller.hasRole,
      decoderHasDecodeRole: r.decoder.hasRole,
      schemaShared: r.schemaShared,
      identityMatch: r.identityMatch,
      familyCertified: isCertified(certification, r.family, r.llamaBuild),
    },
  };
}

/**
 * The rate over the last chunk of `tokens` from `cached` (undefined: nothing computes); with
 * layer capture the remainder is computed first and the last chunk is a full one.
 */
function _lastChunkTokensPerS(
  points: NodeRates["prefill"],
  tokens: number,
  cached: number,
  chunkTokens: number,
  remainderFirst: boolean,
): number | undefined {
  const computed = tokens - cached;
  if (!(computed > 0 && chunkTokens > 0)) return undefined;
  const last = lastChunkTokens(computed, chunkTokens, remainderFirst);
  return averagePrefillTokensPerS(points, tokens, tokens - last);
}

function _source(n: NodeRates): string {
  return n.sourceNote ? `${n.source} (${n.sourceNote})` : n.source;
}

/**
 * The plan's HandoffCosts from what the pair measured: every term but the ones placement uses
 * itself (the probe step, the first token's overhead) and the sample count. Passed whole, so a
 * new HandoffCosts term reaches the plan without a copy here (two had been silently 0).
 */
function handoffCostsOf(c: MeasuredHandoffCosts | undefined): HandoffCosts {
  if (!c) return {};
  const { probes: _probes, firstTokenOverheadMs: _first, samples: _samples, ...costs } = c;
  return costs;
}
