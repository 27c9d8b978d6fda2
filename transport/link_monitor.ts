/**
 * LinkMonitor: keeps a `LinkEstimator` (core/link_estimates.ts) fed for the peers of this
 * node: pings on each connection's control stream (periodic with `watch()`, or a burst with
 * `measure()`), a short bandwidth probe when no recent bulk sample exists, a datagram loss
 * probe when no recent one exists (`probeLoss()`; pings cannot see a few lost packets), and
 * the handoffs' own transfers (`recordTransfer()` with a handoff's bytes and wire time). A
 * coordinator asks `estimate({ from, to })` for a pair and hands the result to
 * `placeRequest()`.
 *
 * Pairs are directed, from this node's id to the peer's: a node measures the links it sends
 * on. The clock is `performance.now()` of this process (durations only; never sent).
 */
import { type LinkEstimate, LinkEstimator, type PeerPair } from "../core/link_estimates.ts";
import type { LossProbeResult } from "./loss_probe.ts";
import type { PeerConnection } from "./peer.ts";

/** Bounds of the monitor, each with its unit last. */
export interface LinkMonitorOptions {
  /** `watch()` pings each peer this often. */
  pingIntervalMs: number;
  /** `measure()` sends this many pings. */
  pingsPerMeasure: number;
  /** A bulk sample younger than this needs no probe. */
  bandwidthAgeMsMax: number;
  /** Bytes of one probe (bounded again by the connection's `probeBytesMax`). */
  probeBytes: number;
  /**
   * Datagrams of one loss probe: 10,000 tell 0.1% loss (about 10 lost) from none (a lossless
   * link loses none; at 0.1%, 6 or more are lost 93% of the time).
   */
  lossProbeDatagrams: number;
  /** The loss probe's pace, as a share of the measured bandwidth (its own queue never drops). */
  lossProbeRateShare: number;
  /**
   * And at most this many bytes/s: a receiver reads each datagram in JavaScript, and one that
   * falls behind loses a run of them (one loss event, but not a measurement of the link).
   */
  lossProbeBytesPerSMax: number;
  /** A loss probe sends for at most this long: fewer datagrams on a slow link. */
  lossProbeSendMsMax: number;
  /** A loss probe younger than this needs no new one. */
  lossProbeAgeMsMax: number;
}

export const DEFAULT_LINK_MONITOR_OPTIONS: Readonly<LinkMonitorOptions> = Object.freeze({
  pingIntervalMs: 1_000,
  pingsPerMeasure: 5,
  bandwidthAgeMsMax: 20_000,
  probeBytes: 8 * 1024 * 1024,
  lossProbeDatagrams: 10_000,
  lossProbeRateShare: 0.5,
  lossProbeBytesPerSMax: 50e6,
  lossProbeSendMsMax: 1_000,
  lossProbeAgeMsMax: 20_000,
});

export class LinkMonitor {
  readonly estimator: LinkEstimator;
  readonly options: LinkMonitorOptions;
  readonly #localNodeId: string;

  constructor(
    localNodeId: string,
    estimator = new LinkEstimator(),
    options: Partial<LinkMonitorOptions> = {},
  ) {
    this.#localNodeId = localNodeId;
    this.estimator = estimator;
    this.options = { ...DEFAULT_LINK_MONITOR_OPTIONS, ...options };
  }

  /** The pair this node sends on to `peer`. */
  pairTo(peer: PeerConnection): PeerPair {
    return { from: this.#localNodeId, to: peer.peerNodeId };
  }

  /** Pings `peer` once and records the RTT or the loss. */
  async pingOnce(peer: PeerConnection): Promise<number | null> {
    const rtt = await peer.ping();
    const pair = this.pairTo(peer);
    if (rtt === null) this.estimator.recordPingLost(pair, performance.now());
    else this.estimator.recordRtt(pair, rtt, performance.now());
    return rtt;
  }

  /**
   * A burst of pings, then a bandwidth probe if no bulk sample is recent, then a loss probe if
   * none is recent and the peer answers one: afterwards the estimate is fresh. Resolves with it
   * (null only if every ping was lost and the probe failed). A failed loss probe leaves the
   * loss to the pings, which the estimate names (`lossSource`).
   */
  async measure(
    peer: PeerConnection,
    probeBytes = this.options.probeBytes,
  ): Promise<LinkEstimate | null> {
    await this.measureRate(peer, probeBytes);
    await this.probeLoss(peer).catch(() => null);
    return this.estimate(this.pairTo(peer));
  }

  /**
   * `measure()` without the loss probe: a burst of pings, and a bandwidth probe if due. Returns
   * that probe's bytes and receive time (null: none was due).
   */
  async measureRate(
    peer: PeerConnection,
    probeBytes = this.options.probeBytes,
  ): Promise<{ bytes: number; receiveMs: number } | null> {
    for (let k = 0; k < this.options.pingsPerMeasure; k++) await this.pingOnce(peer);
    const pair = this.pairTo(peer);
    const age = this.estimator.bandwidthAgeMs(pair, performance.now());
    if (age !== null && age <= this.options.bandwidthAgeMsMax) return null;
    const r = await peer.probeBandwidth(probeBytes);
    this.estimator.recordTransfer(pair, r.bytes, r.receiveMs, performance.now(), "probe");
    return { bytes: r.bytes, receiveMs: r.receiveMs };
  }

  /**
   * A datagram loss probe of `peer`, recorded, unless a recent one exists or the peer cannot
   * answer one (null then). Paced at `lossProbeRateShare` of the pair's bandwidth estimate
   * (none yet: nothing sent), at most `lossProbeBytesPerSMax`, for at most
   * `lossProbeSendMsMax`. Rejects if the probe failed.
   */
  async probeLoss(peer: PeerConnection): Promise<LossProbeResult | null> {
    const o = this.options;
    const pair = this.pairTo(peer);
    const age = this.estimator.lossProbeAgeMs(pair, performance.now());
    if (!peer.supportsLossProbe || (age !== null && age <= o.lossProbeAgeMsMax)) return null;
    const e = this.estimate(pair);
    const bw = e?.bandwidthBytesPerS;
    const bytes = peer.datagramBytesMax;
    if (!bw || bytes <= 0) return null;
    const bytesPerS = Math.min(bw * o.lossProbeRateShare, o.lossProbeBytesPerSMax);
    const datagrams = Math.min(
      o.lossProbeDatagrams,
      Math.max(100, Math.floor((bytesPerS * o.lossProbeSendMsMax) / 1000 / bytes)),
    );
    const rttMs = e?.rttMs ?? 0;
    // Datagrams still queued or in flight when the last leaves: a few round trips' worth.
    const r = await peer.probeLoss({ datagrams, bytesPerS, graceMs: Math.max(50, 4 * rttMs) });
    this.estimator.recordLossProbe(pair, r.sent, r.lossEvents, performance.now());
    return r;
  }

  /** Pings `peer` every `pingIntervalMs` until the returned stop function runs or it closes. */
  watch(peer: PeerConnection): () => void {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      if (stopped) return;
      try {
        await this.pingOnce(peer);
      } catch {
        stopped = true; // the connection ended: nothing more to measure on it
        return;
      }
      if (!stopped) timer = setTimeout(tick, this.options.pingIntervalMs);
    };
    peer.closed.then(() => {
      stopped = true;
      clearTimeout(timer);
    });
    tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  /** A handoff's own transfer to `to`: its bytes over its wire time (telemetry). */
  recordTransfer(to: string, bytes: number, wireMs: number): boolean {
    return this.estimator.recordTransfer(
      { from: this.#localNodeId, to },
      bytes,
      wireMs,
      performance.now(),
      "handoff",
    );
  }

  /** The estimate for `pair` now (what `placeRequest()` reads). */
  estimate(pair: PeerPair): LinkEstimate | null {
    return this.estimator.estimate(pair, performance.now());
  }
}
