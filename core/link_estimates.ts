/**
 * Per peer-pair link estimates: RTT samples (control-stream pings), bandwidth samples (the
 * handoffs' own bulk transfers; a short probe or a stated figure only while no handoff sample
 * is fresh), loss (datagram loss probes, else lost
 * pings), each in a bounded recent window with its age, and degradation detection (a
 * bandwidth drop or an RTT rise against the window's own earlier samples).
 *
 * Pure: every call takes the caller's clock reading `atMs` (a local monotonic clock; these
 * readings never leave the process). The planner reads `estimate()`; a degraded or stale
 * estimate stops new disaggregated requests, and sessions already running are never touched.
 *
 * @module
 */
import { UsageError } from "./errors.ts";
import { median } from "./median.ts";

/** A directed pair of nodes: the prefiller sends to the decoder. */
export interface PeerPair {
  from: string;
  to: string;
}

/** Where a bandwidth sample came from. */
export type BandwidthSource = "handoff" | "probe" | "manual";

/**
 * Where the loss fraction came from: datagram loss probes (packets lost, never retransmitted),
 * or, without a probe in the window, unanswered pings (which a stream retransmits: they show
 * a dead or congested link, not a few lost packets); "stated": a figure given (`plan --loss`).
 */
export type LossSource = "datagrams" | "pings" | "stated";

/** Bounds and thresholds of the estimator, each with its unit last. */
export interface LinkEstimatorOptions {
  /** Samples of each kind kept per pair (oldest dropped first). */
  samplesMax: number;
  /** Samples older than this are ignored by `estimate()`. */
  windowMsMax: number;
  /** Bulk transfers smaller than this say more about latency than rate: not a sample. */
  bandwidthSampleBytesMin: number;
  /** The newest bandwidth sample under this share of the earlier median is a drop. */
  bandwidthDropRatio: number;
  /** The median of the newest `recentSamples` RTTs over this multiple of the earlier minimum... */
  rttRiseRatio: number;
  /** ...and over it by at least this much is a rise (sub-millisecond jitter is not). */
  rttRiseMsMin: number;
  /** Samples that make up "recent" for the rise and drop checks. */
  recentSamples: number;
  /** Pair count kept (least recently updated pair dropped first). */
  pairsMax: number;
}

export const DEFAULT_LINK_ESTIMATOR_OPTIONS: Readonly<LinkEstimatorOptions> = Object.freeze({
  samplesMax: 64,
  windowMsMax: 60_000,
  bandwidthSampleBytesMin: 1024 * 1024,
  bandwidthDropRatio: 0.5,
  rttRiseRatio: 2,
  rttRiseMsMin: 1,
  recentSamples: 3,
  pairsMax: 1024,
});

/** Why an estimate counts as degraded. */
export interface LinkDegradation {
  code: "bandwidth-drop" | "rtt-rise";
  message: string;
}

/** What the planner reads for one pair. */
export interface LinkEstimate {
  pair: PeerPair;
  /**
   * Median of the recent bandwidth samples (after a drop: the newest ones): the handoffs' own
   * transfers where any is in the window, else the probes (or stated figures).
   */
  bandwidthBytesPerS: number | null;
  /** Median of the recent RTT samples (after a rise: the newest ones). */
  rttMs: number | null;
  /**
   * Loss events (runs of consecutive lost datagrams, each once) over datagrams sent by the
   * loss probes in the window; without one, lost pings over pings sent (null: neither).
   */
  lossFraction: number | null;
  /** What `lossFraction` counts (null: nothing measured). */
  lossSource: LossSource | null;
  /** The datagrams (or pings) behind `lossFraction`. */
  lossSamples: number;
  /**
   * Median of the recent tail samples (`handoffTailSample`): the rate the link delivered a
   * handoff's last large frame at, once the prefiller's compute had stopped sharing its host;
   * null: none in the window.
   */
  tailBytesPerS: number | null;
  /** Age of the older of the newest bandwidth and newest RTT sample. */
  ageMs: number;
  /** The bandwidth samples behind `bandwidthBytesPerS`. */
  bandwidthSamples: number;
  rttSamples: number;
  /** Where the newest of those samples came from. */
  bandwidthSource: BandwidthSource | null;
  degraded: LinkDegradation | null;
}

interface Sample {
  atMs: number;
  value: number;
  /** A bandwidth sample's source. */
  source?: BandwidthSource;
}

interface PairState {
  pair: PeerPair;
  bandwidth: Sample[];
  /** Tail samples (`recordTailTransfer`), bytes/s. */
  tail: Sample[];
  rtt: Sample[];
  /** One entry per ping: 1 lost, 0 answered. */
  pings: Sample[];
  /** One entry per loss probe: its loss events (value) over `sent` datagrams. */
  lossProbes: (Sample & { sent: number; stated?: true })[];
  touchedMs: number;
}

/**
 * Keeps the recent link samples of every peer pair.
 *
 * @example
 * ```ts
 * const links = new LinkEstimator();
 * links.recordRtt({ from: "p", to: "d" }, 0.4, now);
 * links.recordTransfer({ from: "p", to: "d" }, 64 << 20, 120, now, "handoff");
 * links.estimate({ from: "p", to: "d" }, now)?.bandwidthBytesPerS; // ~559 MB/s
 * ```
 */
export class LinkEstimator {
  readonly options: LinkEstimatorOptions;
  readonly #pairs = new Map<string, PairState>();

  constructor(options: Partial<LinkEstimatorOptions> = {}) {
    this.options = { ...DEFAULT_LINK_ESTIMATOR_OPTIONS, ...options };
    const o = this.options;
    for (const [name, v] of Object.entries(o)) {
      if (!(Number.isFinite(v) && v > 0)) {
        throw new UsageError(`Invalid link estimator option ${name} ${v}: must be positive`);
      }
    }
    if (o.bandwidthDropRatio >= 1 || o.rttRiseRatio <= 1) {
      throw new UsageError(
        "Invalid link estimator options: bandwidthDropRatio must be under 1, rttRiseRatio over 1",
      );
    }
  }

  /** One ping round trip in ms. */
  recordRtt(pair: PeerPair, rttMs: number, atMs: number): void {
    _check("rttMs", rttMs, true);
    const s = this.#state(pair, atMs);
    _push(s.rtt, { atMs, value: rttMs }, this.options.samplesMax);
    _push(s.pings, { atMs, value: 0 }, this.options.samplesMax);
  }

  /** A ping that got no answer within its timeout. */
  recordPingLost(pair: PeerPair, atMs: number): void {
    _push(this.#state(pair, atMs).pings, { atMs, value: 1 }, this.options.samplesMax);
  }

  /**
   * One datagram loss probe (transport/loss_probe.ts): `lossEvents` runs of lost datagrams
   * among `sent`.
   */
  recordLossProbe(pair: PeerPair, sent: number, lossEvents: number, atMs: number): void {
    if (!(Number.isInteger(sent) && sent > 0 && Number.isInteger(lossEvents))) {
      throw new UsageError(
        `Invalid loss probe of ${lossEvents} events in ${sent}: counts must be integers, sent positive`,
      );
    }
    if (lossEvents < 0 || lossEvents > sent) {
      throw new UsageError(`Invalid loss probe: ${lossEvents} loss events in ${sent} sent`);
    }
    const s = this.#state(pair, atMs);
    s.lossProbes.push({ atMs, value: lossEvents, sent });
    if (s.lossProbes.length > this.options.samplesMax) s.lossProbes.shift();
  }

  /**
   * A loss fraction given rather than measured (`plan --loss`): kept as a loss probe of a
   * million datagrams, so the estimate reads it to 1e-6, and named "stated".
   */
  recordStatedLoss(pair: PeerPair, lossFraction: number, atMs: number): void {
    if (!(lossFraction >= 0 && lossFraction <= 1)) {
      throw new UsageError(`Invalid stated loss ${lossFraction}: a fraction from 0 to 1`);
    }
    const s = this.#state(pair, atMs);
    s.lossProbes.push({ atMs, value: Math.round(lossFraction * 1e6), sent: 1e6, stated: true });
    if (s.lossProbes.length > this.options.samplesMax) s.lossProbes.shift();
  }

  /** Age of the newest loss probe of `pair` (null: none in the window). */
  lossProbeAgeMs(pair: PeerPair, atMs: number): number | null {
    const s = this.#pairs.get(_key(pair));
    const fresh = s ? s.lossProbes.filter((x) => atMs - x.atMs <= this.options.windowMsMax) : [];
    return fresh.length ? atMs - fresh[fresh.length - 1].atMs : null;
  }

  /**
   * One bulk transfer: `bytes` over `wireMs` of sending. Returns false (and records nothing)
   * when it was too small to say anything about the rate.
   */
  recordTransfer(
    pair: PeerPair,
    bytes: number,
    wireMs: number,
    atMs: number,
    source: BandwidthSource,
  ): boolean {
    _check("bytes", bytes, true);
    _check("wireMs", wireMs, false);
    if (bytes < this.options.bandwidthSampleBytesMin || wireMs <= 0) return false;
    const s = this.#state(pair, atMs);
    _push(s.bandwidth, { atMs, value: (bytes / wireMs) * 1000, source }, this.options.samplesMax);
    return true;
  }

  /**
   * The rate a handoff's last large frame arrived at (`handoffTailSample`): `bytes` over `ms`.
   * Kept apart from the transfers: the planner drains what is still queued at prefill end at it.
   */
  recordTailTransfer(pair: PeerPair, bytes: number, ms: number, atMs: number): void {
    _check("bytes", bytes, false);
    _check("ms", ms, false);
    _push(
      this.#state(pair, atMs).tail,
      { atMs, value: (bytes / ms) * 1000 },
      this.options.samplesMax,
    );
  }

  /** Age of the newest bandwidth sample of `pair`, of any source (null: none in the window). */
  bandwidthAgeMs(pair: PeerPair, atMs: number): number | null {
    const s = this.#pairs.get(_key(pair));
    const fresh = s ? _fresh(s.bandwidth, atMs, this.options.windowMsMax) : [];
    return fresh.length ? atMs - fresh[fresh.length - 1].atMs : null;
  }

  /** The estimate for `pair` now; null when it has no sample in the window at all. */
  estimate(pair: PeerPair, atMs: number): LinkEstimate | null {
    const s = this.#pairs.get(_key(pair));
    if (!s) return null;
    const o = this.options;
    const bwAll = _fresh(s.bandwidth, atMs, o.windowMsMax);
    const handoffs = bwAll.filter((x) => x.source === "handoff");
    const bw = handoffs.length ? handoffs : bwAll;
    const tail = _fresh(s.tail, atMs, o.windowMsMax);
    const rtt = _fresh(s.rtt, atMs, o.windowMsMax);
    const pings = _fresh(s.pings, atMs, o.windowMsMax);
    const probes = s.lossProbes.filter((x) => atMs - x.atMs <= o.windowMsMax);
    if (bw.length === 0 && rtt.length === 0 && pings.length === 0 && probes.length === 0) {
      return null;
    }
    const sent = probes.reduce((n, p) => n + p.sent, 0);
    const loss = probes.length
      ? {
        fraction: probes.reduce((n, p) => n + p.value, 0) / sent,
        source: probes.some((p) => p.stated) ? "stated" as const : "datagrams" as const,
      }
      : pings.length
      ? {
        fraction: pings.reduce((n, p) => n + p.value, 0) / pings.length,
        source: "pings" as const,
      }
      : null;
    const degraded = this.#bandwidthDrop(bw) ?? this.#rttRise(rtt);
    const recentBw = degraded?.code === "bandwidth-drop" ? bw.slice(-1) : bw;
    const recentRtt = degraded?.code === "rtt-rise" ? rtt.slice(-o.recentSamples) : rtt;
    const newest = (xs: Sample[]) => (xs.length ? xs[xs.length - 1].atMs : -Infinity);
    const oldestNewest = Math.min(newest(bw), newest(rtt));
    return {
      pair: { ...s.pair },
      bandwidthBytesPerS: bw.length ? median(recentBw.map((x) => x.value)) : null,
      rttMs: rtt.length ? median(recentRtt.map((x) => x.value)) : null,
      tailBytesPerS: tail.length ? median(tail.map((x) => x.value)) : null,
      lossFraction: loss?.fraction ?? null,
      lossSource: loss?.source ?? null,
      lossSamples: probes.length ? sent : pings.length,
      ageMs: Number.isFinite(oldestNewest) ? atMs - oldestNewest : Infinity,
      bandwidthSamples: bw.length,
      rttSamples: rtt.length,
      bandwidthSource: bw.length ? bw[bw.length - 1].source ?? null : null,
      degraded,
    };
  }

  /** Forgets a pair (a peer left). */
  forget(pair: PeerPair): void {
    this.#pairs.delete(_key(pair));
  }

  #bandwidthDrop(bw: Sample[]): LinkDegradation | null {
    if (bw.length < 2) return null;
    const before = median(bw.slice(0, -1).map((x) => x.value));
    const last = bw[bw.length - 1].value;
    if (last >= this.options.bandwidthDropRatio * before) return null;
    return {
      code: "bandwidth-drop",
      message: `newest transfer ran at ${_mbps(last)}, under ${this.options.bandwidthDropRatio} ` +
        `of the earlier median ${_mbps(before)}`,
    };
  }

  #rttRise(rtt: Sample[]): LinkDegradation | null {
    const k = this.options.recentSamples;
    if (rtt.length <= k) return null;
    const baseline = Math.min(...rtt.slice(0, -k).map((x) => x.value));
    const recent = median(rtt.slice(-k).map((x) => x.value));
    const o = this.options;
    if (recent <= baseline * o.rttRiseRatio || recent - baseline < o.rttRiseMsMin) return null;
    return {
      code: "rtt-rise",
      message: `recent RTT ${recent.toFixed(2)} ms is over ${o.rttRiseRatio}x the earlier ` +
        `minimum ${baseline.toFixed(2)} ms`,
    };
  }

  #state(pair: PeerPair, atMs: number): PairState {
    _check("atMs", atMs, true);
    const key = _key(pair);
    let s = this.#pairs.get(key);
    if (!s) {
      if (this.#pairs.size >= this.options.pairsMax) {
        let oldest: string | null = null;
        let oldestMs = Infinity;
        for (const [k, v] of this.#pairs) {
          if (v.touchedMs < oldestMs) [oldest, oldestMs] = [k, v.touchedMs];
        }
        if (oldest !== null) this.#pairs.delete(oldest);
      }
      s = {
        pair: { ...pair },
        bandwidth: [],
        tail: [],
        rtt: [],
        pings: [],
        lossProbes: [],
        touchedMs: atMs,
      };
      this.#pairs.set(key, s);
    }
    s.touchedMs = atMs;
    return s;
  }
}

function _key(p: PeerPair): string {
  if (!p.from || !p.to) throw new UsageError("A peer pair needs both node ids");
  return `${p.from}\u0000${p.to}`;
}

function _check(name: string, v: number, zeroOk: boolean): void {
  if (!(Number.isFinite(v) && (zeroOk ? v >= 0 : v > 0))) {
    throw new UsageError(
      `Invalid link sample ${name} ${v}: must be ${zeroOk ? "0 or more" : "positive"}`,
    );
  }
}

function _push(xs: Sample[], x: Sample, max: number): void {
  xs.push(x);
  if (xs.length > max) xs.splice(0, xs.length - max);
}

function _fresh(xs: Sample[], atMs: number, windowMs: number): Sample[] {
  return xs.filter((x) => atMs - x.atMs <= windowMs);
}

function _mbps(bytesPerS: number): string {
  return `${((bytesPerS * 8) / 1e6).toFixed(0)} Mbit/s`;
}

/** The fields of a handoff record `handoffTransferSample` reads (core/telemetry.ts). */
export interface HandoffTransferFacts {
  totalBytes: number;
  wireMs: number;
  /** Chunks written behind a backlog: bytes, and time (absent: an older prefiller). */
  backlogBytes?: number;
  backlogMs?: number;
  uncoveredTailMs: number | null;
  commitMs: number | null;
  stagedBeforePrefillEndFraction: number | null;
  overlapFraction: number | null;
  /**
   * The last recurrent layer's capture before compute end (absent or null: no layer capture):
   * with capture, the recurrent state left during the last chunk, not after it.
   */
  captureLeadMs?: number | null;
  /** The decoder's timing of the last large frame's arrival (absent: an older decoder). */
  tailArrivalBytes?: number | null;
  tailArrivalMs?: number | null;
}

/**
 * A bandwidth sample from a handoff's own transfer, or null when the record cannot give a
 * clean one. Where `wireSampleBytesMin` or more were written behind a backlog (each chunk
 * exported before the previous write ended, so the send window was full as it began), those
 * bytes over their time are the rate the link sustained: a long transfer's own, with its
 * congestion controller's losses in it, which a short probe does not see (FINDINGS section
 * 0000000000). Else the sender's summed write time (`wireMs`), which ends when the transport
 * accepts the bytes, not when they arrive: a stream's send window (~1.25 MB on Deno QUIC) can
 * be ahead of the wire (a chunk written to an idle link returns early), so it only counts for
 * transfers of `wireSampleBytesMin` or more. Otherwise, when nothing was staged before prefill
 * ended and no layer was captured during the last chunk (every byte crossed after it), the
 * span from prefill end to CommitAck, less the decoder's validate/import/probe and half a
 * round trip, is the delivery time of all the bytes.
 */
export function handoffTransferSample(
  t: HandoffTransferFacts,
  rttMs: number,
  wireSampleBytesMin = 32 * 1024 * 1024,
): { bytes: number; ms: number } | null {
  const backlog = t.backlogBytes ?? 0, backlogMs = t.backlogMs ?? 0;
  if (backlog >= wireSampleBytesMin && backlogMs > 0) return { bytes: backlog, ms: backlogMs };
  if (t.totalBytes >= wireSampleBytesMin && t.wireMs > 0) {
    return { bytes: t.totalBytes, ms: t.wireMs };
  }
  const allAfterPrefill = (t.stagedBeforePrefillEndFraction ?? 0) === 0 &&
    (t.overlapFraction ?? 0) === 0 && (t.captureLeadMs ?? null) === null;
  if (!allAfterPrefill || t.uncoveredTailMs === null) return null;
  const ms = t.uncoveredTailMs - (t.commitMs ?? 0) - rttMs / 2;
  return ms > 0 ? { bytes: t.totalBytes, ms } : null;
}

/**
 * The handoff's tail sample: the rate its last state frame of 1 MiB or more arrived at, as the
 * decoder timed it (HandoffTelemetry.tailArrivalBytes), or null without one. With layer
 * capture that frame is the last recurrent layer's, which mostly crosses after compute end: on
 * a host the prefill compute shares with the transport, faster than the transfer ran during
 * prefill (FINDINGS section 00000000000000000000000000). A large frame leaves back to back,
 * so its body's arrival span is the link's time for it, whatever the sender's window.
 */
export function handoffTailSample(t: HandoffTransferFacts): { bytes: number; ms: number } | null {
  const bytes = t.tailArrivalBytes ?? null, ms = t.tailArrivalMs ?? null;
  return bytes !== null && ms !== null && bytes > 0 && ms > 0 ? { bytes, ms } : null;
}
