/**
 * `--placement auto` over live facts: the planner's cost comparison (core/placement.ts via
 * serve/link_placement.ts `placeOverPeers()`) with the link estimate of the prefill -> decode
 * pair, both workers' rates and the certification file. Where a fact is missing, the no-link
 * rule of `decidePlacement()` (api/placement.ts) applies, and the reason names what was missing.
 *
 * What the coordinator measures, and what it cannot:
 * - It pings its own links to each worker (a `LinkMonitor`, one ping per `pingIntervalMs` per
 *   worker at most). It has no view of the prefill -> decode link itself.
 * - That link is **estimated from the handoffs' own transfers** (`handoffTransferSample()` on
 *   each disaggregated request's telemetry), and its RTT is stood in for by the coordinator's
 *   own RTT to the decode worker at the time of that handoff. A handoff whose state left
 *   during its prefill (small, or streamed by layer capture) gives no rate; while no handoff
 *   sample is fresh, the prefill worker's own bandwidth probe of that link (run after a
 *   committed handoff, carried with its loss probe) stands in. Before either (or once they age
 *   out of the estimator's window) there is no estimate: "no link measurement yet", and the
 *   no-link rule decides (a long prompt disaggregates, which takes the next sample).
 * - Rates come from a calibration file (`bench calibrate`) or are learned from completed
 *   requests (`RateRecorder`): the prefill worker's prefill time from handoff telemetry, the
 *   decode worker's prefill rate from colocated requests' TTFT (which includes its queue: a
 *   pessimistic rate), its decode rate from the continuation probe and TPOT. Without both
 *   workers' rates: the no-link rule, named.
 * - A family not certified in the certification file (`correctness state-handoff --certify`)
 *   for the decode worker's llama.cpp build is never disaggregated automatically.
 * - Its loss is what the prefill worker measured: after committed handoffs it probes its link
 *   to the decode worker with datagrams (serve/link_loss.ts), and each outcome carries the
 *   newest probe, recorded here once per probe. Without one, the coordinator's pings to the
 *   decode worker stand in (they do not see a few lost packets), and the reason says so.
 * - The tail's fixed costs are learned per pair from the handoffs it served
 *   (`HandoffCostRecorder`, core/link_costs.ts: the decoder's probe, the import left at
 *   commit, the prefiller's measured tail export, the first token's overhead). Until a pair
 *   has served a handoff, the planner's defaults stand. Whether the prefill worker streams the
 *   recurrent state during the last chunk (layer capture) is what it announces.
 */
import { type CertificationFile, isCertified } from "../core/certification.ts";
import {
  handoffTailSample,
  handoffTransferSample,
  type LinkEstimate,
  LinkEstimator,
  type LinkEstimatorOptions,
  type PeerPair,
} from "../core/link_estimates.ts";
import { HandoffCostRecorder } from "../core/link_costs.ts";
import { type NodeRates, RateRecorder } from "../core/node_rates.ts";
import type { PlacementPrediction } from "../core/placement.ts";
import type { CongestionControl, StateSize } from "../core/planner.ts";
import type { HandoffResult } from "../serve/coordinator.ts";
import { placeOverPeers } from "../serve/link_placement.ts";
import type { PeerLink } from "../serve/peer_links.ts";
import { LinkMonitor } from "../transport/link_monitor.ts";
import { decidePlacement, type PlacementDecision } from "./placement.ts";

export interface LivePlacementOptions {
  /** This coordinator's node id (the `from` of the pairs it pings). */
  localNodeId: string;
  /** Null: no file (nothing is certified). */
  certification: CertificationFile | null;
  /** Where the certification came from, for the reason ("<path>" or "no file at <path>"). */
  certificationSource: string;
  /** Rates per node id from `--calibration` (null: learn them from completed requests). */
  calibration: readonly NodeRates[] | null;
  /** Each worker is pinged at most this often, in ms. */
  pingIntervalMs: number;
  /** Prefill chunk size the workers use, in tokens (the planner's pipelining term). */
  chunkTokens: number;
  promptTokensMin?: number;
  /**
   * Bounds of the prefill -> decode estimator (notably `bandwidthSampleBytesMin`: a handoff
   * smaller than that is no bandwidth sample).
   */
  pairLinks?: Partial<LinkEstimatorOptions>;
}

export const DEFAULT_LINK_PING_INTERVAL_MS = 2_000;

export interface LiveInput {
  promptTokens: number;
  state: StateSize;
  family: string;
  /** The peers file names a prefill worker (its link may still be null: unreachable). */
  hasPrefillWorker: boolean;
  prefill: PeerLink | null;
  decode: PeerLink | null;
}

export class LivePlacement {
  readonly monitor: LinkMonitor;
  /** The prefill -> decode pairs, fed only by the handoffs' own transfers. */
  readonly pairs: LinkEstimator;
  readonly #recorders = new Map<string, RateRecorder>();
  /** Per prefill -> decode pair: the tail's measured costs. */
  readonly #pairCosts = new Map<string, HandoffCostRecorder>();
  /** Each pair's controller, as the prefill worker reported it with its newest loss probe. */
  readonly #pairControllers = new Map<string, CongestionControl>();
  readonly #watching = new Map<string, { conn: unknown; stop: () => void }>();

  constructor(readonly options: LivePlacementOptions) {
    this.pairs = new LinkEstimator(options.pairLinks);
    this.monitor = new LinkMonitor(options.localNodeId, new LinkEstimator(), {
      pingIntervalMs: options.pingIntervalMs,
    });
  }

  decide(i: LiveInput): PlacementDecision {
    const noLink = decidePlacement({
      mode: "auto",
      promptTokens: i.promptTokens,
      state: i.state,
      family: i.family,
      hasPrefillWorker: i.hasPrefillWorker,
      promptTokensMin: this.options.promptTokensMin,
    });
    const rule = (why: string): PlacementDecision => ({
      ...noLink,
      reason: `${why}; no-link rule: ${noLink.reason}`,
      prediction: null,
    });
    if (!i.hasPrefillWorker) return { ...noLink, prediction: null };
    if (!i.prefill) return rule("prefill worker not connected");
    if (!i.decode) return rule("decode worker not connected yet");
    this.#watch(i.prefill);
    this.#watch(i.decode);
    const uncertified = this.#uncertified(i.decode, i.family, noLink);
    if (uncertified) return uncertified;
    const pid = i.prefill.peerNodeId, did = i.decode.peerNodeId;
    const prefillRates = this.#rates(pid, "prefill"), decodeRates = this.#rates(did, "decode");
    if (!prefillRates || !decodeRates) {
      const who = [!prefillRates ? `prefill ${pid}` : "", !decodeRates ? `decode ${did}` : ""]
        .filter(Boolean).join(" and ");
      return rule(`no node rates yet for ${who} (no --calibration entry, none learned yet)`);
    }
    const now = performance.now();
    const est = this.pairs.estimate({ from: pid, to: did }, now);
    if (!est || est.bandwidthBytesPerS === null || est.rttMs === null) {
      return rule(
        "no link measurement yet (the prefill->decode link is estimated from the handoffs' own " +
          "transfers, or the prefill worker's probe after a committed handoff)",
      );
    }
    const peers = { prefill: i.prefill, decode: i.decode };
    return this.#plan(i, peers, { prefillRates, decodeRates }, est, now);
  }

  /** Refuses automatic disaggregation for a family and build without a certification. */
  #uncertified(
    decode: PeerLink,
    family: string,
    noLink: PlacementDecision,
  ): PlacementDecision | null {
    const announced = decode.peerCapabilities.numericalIdentity;
    const id = (typeof announced === "object" && announced !== null ? announced : {}) as Record<
      string,
      unknown
    >;
    const announcedFamily = typeof id.family === "string" ? id.family : family;
    const build = typeof id.llamaBuild === "string" ? id.llamaBuild : "unknown";
    if (isCertified(this.options.certification, announcedFamily, build)) return null;
    return {
      placement: "colocated",
      reason: `family ${announcedFamily} on llama.cpp ${build} is not certified for an exact ` +
        `handoff (${this.options.certificationSource}): never disaggregated automatically; ` +
        "certify it with `correctness state-handoff --certify`" +
        (noLink.placement === "colocated" ? `; also ${noLink.reason}` : ""),
      prediction: null,
    };
  }

  /** The planner's decision for the pair, with what it was estimated from. */
  #plan(
    i: LiveInput,
    peers: { prefill: PeerLink; decode: PeerLink },
    rates: { prefillRates: NodeRates; decodeRates: NodeRates },
    est: LinkEstimate,
    now: number,
  ): PlacementDecision {
    const pid = peers.prefill.peerNodeId, did = peers.decode.peerNodeId;
    const learned = this.#pairCosts.get(_pairKey(pid, did));
    const d = placeOverPeers({
      promptTokens: i.promptTokens,
      prefill: { peerNodeId: pid, peerCapabilities: peers.prefill.peerCapabilities },
      decode: { peerNodeId: did, peerCapabilities: peers.decode.peerCapabilities },
      ...rates,
      // Unknown to the coordinator; the decoder's reservation checks it.
      decodeFreeBytes: Number.MAX_SAFE_INTEGER,
      state: i.state,
      chunkTokens: this.options.chunkTokens,
      links: this.pairs,
      nowMs: now,
      certification: this.options.certification,
      costs: learned?.costs(),
      // Announced by the prefill worker (capabilities.ts), from a capture it really opened.
      snapshotDuringLastChunk: peers.prefill.peerCapabilities.layerCapture === true,
      lastPageDuringLastChunk: peers.prefill.peerCapabilities.lastPageCapture === true,
      congestionControl: this.#pairControllers.get(_pairKey(pid, did)),
      options: this.options.promptTokensMin === undefined
        ? {}
        : { promptTokensMin: this.options.promptTokensMin },
    });
    const messages = d.reasons.map((r) => r.message).join("; ");
    const mbps = ((est.bandwidthBytesPerS! * 8) / 1e6).toFixed(0);
    return {
      placement: d.placement === "disaggregated" ? "disaggregated" : "colocated",
      reason: `planner: ${messages} (prefill->decode link estimated from ${est.bandwidthSamples} ` +
        `${
          est.bandwidthSource === "handoff"
            ? "handoff transfers"
            : "bandwidth probes of the prefill worker (no handoff sample yet)"
        }, ${mbps} Mbit/s; RTT stood in by the coordinator's ping to the decode ` +
        `worker; ${
          est.lossSource === "datagrams"
            ? `loss ${((est.lossFraction ?? 0) * 100).toFixed(2)}% of the prefill worker's ` +
              `${est.lossSamples} probe datagrams`
            : "loss not probed yet (pings cannot see a few lost packets)"
        }; rates: prefill ${d.rateSources.prefiller}, decode ${d.rateSources.decoder})`,
      prediction: d.prediction,
    };
  }

  /**
   * Learns from one completed request: rates, and the pair's bandwidth from a handoff.
   * `predictedLinkMs` is the link time the planner predicted for it (`PlacementPrediction`
   * `linkMs`; null: not planned on costs), what its link residual is measured against.
   */
  record(
    result: HandoffResult,
    prefillNodeId: string | null,
    decodeNodeId: string,
    predictedLinkMs: number | null = null,
  ): void {
    const t = result.telemetry;
    const now = performance.now();
    const clean = result.fallbacks.length === 0;
    if (result.placement === "disaggregated" && prefillNodeId && clean) {
      this.#recorder(prefillNodeId).recordHandoffPrefill(t);
      if (t.probeMs) this.#recorder(decodeNodeId).recordDecode(1, t.probeMs, t.promptTokens);
      const pair: PeerPair = { from: prefillNodeId, to: decodeNodeId };
      const rtt = this.monitor.estimate({ from: this.options.localNodeId, to: decodeNodeId });
      if (rtt?.rttMs != null) {
        this.pairs.recordRtt(pair, rtt.rttMs, now);
        const sample = handoffTransferSample(t, rtt.rttMs);
        if (sample) this.pairs.recordTransfer(pair, sample.bytes, sample.ms, now, "handoff");
        const tail = handoffTailSample(t);
        if (tail) this.pairs.recordTailTransfer(pair, tail.bytes, tail.ms, now);
      }
      this.#learnCosts(pair, result, now, predictedLinkMs);
    } else if (clean && result.completedBy.nodeId === decodeNodeId && result.promptTokens > 0) {
      // Colocated on the decoder: its TTFT (queue included) bounds its prefill rate.
      this.#recorder(decodeNodeId).recordPrefill(result.promptTokens, result.ttftMs);
    }
    if (clean && t.tpotMs && result.tokens.length > 1) {
      this.#recorder(result.completedBy.nodeId).recordDecode(1, t.tpotMs, result.promptTokens);
    }
  }

  /**
   * A loss probe the prefill worker measured on its link to the decode worker, as the pair's
   * loss, and the bandwidth probe before it as a "probe" rate sample (which the estimator reads
   * only while no handoff sample is fresh). Each probe once: outcomes repeat the newest probe
   * until the next, and the caller (the API service) passes only a probe it has not passed
   * before.
   */
  recordLinkLoss(pair: PeerPair, loss: NonNullable<HandoffResult["linkLoss"]>): void {
    const at = Math.max(0, performance.now() - loss.ageMs);
    this.pairs.recordLossProbe(pair, loss.sent, loss.lossEvents, at);
    const b = loss.bandwidthProbe;
    if (b) this.pairs.recordTransfer(pair, b.bytes, b.receiveMs, at, "probe");
    this.#pairControllers.set(_pairKey(pair.from, pair.to), loss.congestionControl ?? "cubic");
  }

  /** Stops every ping loop. */
  close(): void {
    for (const w of this.#watching.values()) w.stop();
    this.#watching.clear();
  }

  /**
   * The pair's tail costs, from one clean handoff's telemetry. The link residual is learned
   * only against the link time the planner predicted for this handoff: any other figure (bytes
   * left at prefill end over the rate) would count twice what the model already has, such as
   * the last captured layer's send.
   */
  #learnCosts(
    pair: PeerPair,
    result: HandoffResult,
    now: number,
    predictedLinkMs: number | null,
  ): void {
    const t = result.telemetry;
    const key = _pairKey(pair.from, pair.to);
    let learned = this.#pairCosts.get(key);
    if (!learned) this.#pairCosts.set(key, learned = new HandoffCostRecorder());
    const bytes = t.bytesByComponent ?? {};
    // The RTT and rate the predictions use, so the link residual is measured against them.
    const est = this.pairs.estimate(pair, now);
    learned.record(
      {
        ...t,
        bytesByComponent: bytes,
        rttMs: est?.rttMs ?? t.rttMs,
        bandwidthBytesPerS: est?.bandwidthBytesPerS ?? null,
      },
      result.ttftMs,
      predictedLinkMs,
    );
  }

  #watch(link: PeerLink): void {
    const w = this.#watching.get(link.peerNodeId);
    if (w?.conn === link.conn) return;
    w?.stop();
    if (!link.conn.supportsLinkProbe) return;
    this.#watching.set(link.peerNodeId, { conn: link.conn, stop: this.monitor.watch(link.conn) });
  }

  #recorder(nodeId: string): RateRecorder {
    let r = this.#recorders.get(nodeId);
    if (!r) this.#recorders.set(nodeId, r = new RateRecorder(nodeId));
    return r;
  }

  /** A calibration entry for the node id, else for its role's name, else what was learned. */
  #rates(nodeId: string, role: "prefill" | "decode"): NodeRates | null {
    const c = this.options.calibration;
    const cal = c?.find((n) => n.nodeId === nodeId) ?? c?.find((n) => n.nodeId === role);
    if (cal) return cal;
    const r = this.#recorders.get(nodeId)?.rates();
    // The planner reads the prefiller's prefill rate, and the decoder's prefill and decode.
    return r && r.prefill.length > 0 && (role === "prefill" || r.decode.length > 0) ? r : null;
  }
}

export type { PlacementPrediction };

function _pairKey(from: string, to: string): string {
  return `${from}>${to}`;
}
