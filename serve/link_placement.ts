/**
 * Per-request placement over live connections (for `--placement auto`): turns the two peers'
 * announced capabilities into the planner's facts and asks `placeRequest()` (core/placement.ts)
 * with the link estimate of the pair, both nodes' rates and the certification file.
 *
 * The family and llama.cpp build used for the certification lookup are read from the decode
 * peer's announced numerical identity (worker.ts announces `family` and `llamaBuild`); the
 * identities themselves are compared whole, never printed.
 */
import type { CertificationFile } from "../core/certification.ts";
import type { LinkEstimator } from "../core/link_estimates.ts";
import type { NodeRates } from "../core/node_rates.ts";
import { type PlacementDecision, placeRequest } from "../core/placement.ts";
import type { MeasuredHandoffCosts } from "../core/link_costs.ts";
import {
  type CongestionControl,
  type PlanOptions,
  startingController,
  type StateSize,
} from "../core/planner.ts";
import {
  canonicalJson,
  type Capabilities,
  eligibleForHandoff,
  roleCovers,
} from "../transport/mod.ts";

/** A peer as placement sees it: its node id and what it announced. */
export interface PlacementPeer {
  peerNodeId: string;
  peerCapabilities: Capabilities;
}

export interface PeerPlacementInput {
  promptTokens: number;
  prefillerCachedTokens?: number;
  prefill: PlacementPeer;
  decode: PlacementPeer;
  /** Rates each node reported (null: none yet; the request then runs colocated, named). */
  prefillRates: NodeRates | null;
  decodeRates: NodeRates | null;
  /** Prefiller queue wait in ms (its StatsResponse or admission answer). */
  prefillQueueMs?: number;
  decodeFreeBytes: number;
  state: StateSize;
  chunkTokens: number;
  /** The estimator a LinkMonitor (transport/link_monitor.ts) keeps fed for pair prefill -> decode. */
  links: LinkEstimator;
  /** performance.now() of this process (the estimator's clock). */
  nowMs: number;
  certification: CertificationFile | null;
  /** The pair's tail costs measured on its served handoffs (absent: none yet). */
  costs?: MeasuredHandoffCosts;
  /** The prefill worker sends the recurrent state during the last chunk (layer capture). */
  snapshotDuringLastChunk?: boolean;
  /** ...and the last chunk's KV page before that chunk ends. */
  lastPageDuringLastChunk?: boolean;
  /**
   * The controller the prefill worker reported for this pair's link with its newest loss
   * probe (`LinkLossReport`); absent: the one it announced ("auto" before a report: Cubic).
   */
  congestionControl?: CongestionControl;
  options?: Partial<PlanOptions>;
}

/**
 * Chooses colocated or disaggregated for one request, with reasons and the prediction to
 * record beside the measured telemetry.
 *
 * @example
 * ```ts
 * const d = placeOverPeers({ promptTokens, prefill: prefillPeer, decode: decodePeer,
 *   prefillRates, decodeRates, decodeFreeBytes, state, chunkTokens: 512,
 *   links: monitor.estimator, nowMs: performance.now(), certification });
 * const colocated = d.placement !== "disaggregated"; // d.reasons say why
 * ```
 */
export function placeOverPeers(i: PeerPlacementInput): PlacementDecision {
  const p = i.prefill.peerCapabilities, d = i.decode.peerCapabilities;
  // Everything but the identity: protocol, roles, schema, codecs, dtypes.
  const sameId = { numericalIdentity: "placeholder-compared-below" };
  const shared = eligibleForHandoff({ ...p, ...sameId }, { ...d, ...sameId }, "decode");
  const identityMatch = p.numericalIdentity !== undefined && d.numericalIdentity !== undefined &&
    canonicalJson(p.numericalIdentity) === canonicalJson(d.numericalIdentity);
  const id = typeof d.numericalIdentity === "object" ? d.numericalIdentity : {};
  return placeRequest({
    promptTokens: i.promptTokens,
    prefillerCachedTokens: i.prefillerCachedTokens,
    prefiller: {
      nodeId: i.prefill.peerNodeId,
      rates: i.prefillRates,
      hasRole: (p.roles ?? []).some((r) => roleCovers(r, "prefill")),
      queueMs: i.prefillQueueMs,
    },
    decoder: {
      nodeId: i.decode.peerNodeId,
      rates: i.decodeRates,
      hasRole: (d.roles ?? []).some((r) => roleCovers(r, "decode")),
      freeBytes: i.decodeFreeBytes,
    },
    schemaShared: shared.ok,
    identityMatch,
    family: typeof id.family === "string" ? id.family : "unknown",
    llamaBuild: typeof id.llamaBuild === "string" ? id.llamaBuild : "unknown",
    state: i.state,
    chunkTokens: i.chunkTokens,
    costs: i.costs,
    snapshotDuringLastChunk: i.snapshotDuringLastChunk,
    lastPageDuringLastChunk: i.lastPageDuringLastChunk,
    // Reported for this link by the prefill worker, or announced for all of its links.
    congestionControl: i.congestionControl ?? startingController(p.congestionControl),
  }, { links: i.links, nowMs: i.nowMs, certification: i.certification, options: i.options });
}
