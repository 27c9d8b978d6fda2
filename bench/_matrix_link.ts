/**
 * The link a matrix row's planner reads, as a live pair's estimator would hold it for the
 * point's link: the row's own pings, the point's loss probes, and its bandwidth from the
 * point's earlier handoffs' own transfers where it has served any (what `--placement auto`
 * learns a link from, `handoffTransferSample`), else from the row's probe (a pair's cold start).
 * The live matrix (bench/_matrix_point.ts) and its replay (bench/_matrix_replay.ts) both build
 * it here, so a replayed row plans as its run did.
 */
import {
  handoffTailSample,
  type HandoffTransferFacts,
  handoffTransferSample,
  LinkEstimator,
  type PeerPair,
} from "../core/link_estimates.ts";

/** A grid point's link: rate (bits/s), one-way delay and loss. */
export interface LinkPoint {
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
}

/** Loss probes a point's link keeps, as a live pair's window keeps its last minute's. */
export const LOSS_PROBES_PER_POINT = 3;

/** Handoff bandwidth samples a point's link keeps (bytes/s), newest last. */
export const TRANSFERS_PER_POINT = 3;

/**
 * A point's handoff samples (bytes/s, oldest first): the transfers' rates
 * (`handoffTransferSample`) and their tails' (`handoffTailSample`).
 */
export interface PointSamples {
  transfers: number[];
  tails: number[];
}

/** A point's key in the per-point maps ("rate/rtt/loss"). */
export function pointKey(p: LinkPoint): string {
  return `${p.rateBitsPerS}/${p.rttMs}/${p.lossFraction}`;
}

/**
 * The loss probes `p`'s link took before this row (up to `LOSS_PROBES_PER_POINT - 1`, oldest
 * first), then records this row's (`lossFraction`; null: none). Each row measures its link
 * afresh, but a live pair pools the probes of its window, so the planner reads them together.
 */
export function earlierLossProbes(
  byPoint: Map<string, number[]>,
  p: LinkPoint,
  lossFraction: number | null,
): number[] {
  const earlier = byPoint.get(pointKey(p)) ?? [];
  const kept = lossFraction === null ? earlier : [...earlier, lossFraction];
  byPoint.set(pointKey(p), kept.slice(-(LOSS_PROBES_PER_POINT - 1)));
  return earlier;
}

/** Records loss fractions as loss probes of `pair` (a million datagrams each: 1e-6 steps). */
export function recordLossFractions(
  links: LinkEstimator,
  pair: PeerPair,
  fractions: readonly number[],
  atMs = 0,
): void {
  for (const f of fractions) links.recordLossProbe(pair, 1e6, Math.round(f * 1e6), atMs);
}

/**
 * Keeps the bandwidth and tail samples a handoff over `p` gives (`handoffTransferSample`,
 * `handoffTailSample`; none: nothing kept), up to `TRANSFERS_PER_POINT` of each per point.
 */
export function recordPointTransfer(
  byPoint: Map<string, PointSamples>,
  p: LinkPoint,
  t: HandoffTransferFacts,
  rttMs: number,
): void {
  const kept = pointTransfers(byPoint, p);
  const keep = (xs: number[], s: { bytes: number; ms: number } | null) =>
    s ? [...xs, (s.bytes / s.ms) * 1000].slice(-TRANSFERS_PER_POINT) : xs;
  byPoint.set(pointKey(p), {
    transfers: keep(kept.transfers, handoffTransferSample(t, rttMs)),
    tails: keep(kept.tails, handoffTailSample(t)),
  });
}

/** What a row measured of its link: its pings' RTT, its probe's rate, its loss probe. */
export interface RowProbe {
  rttMs: number;
  bandwidthBytesPerS: number;
  lossFraction: number | null;
}

/**
 * The estimator the row's planner reads at `atMs`: the row's RTT; the row's probe and the
 * point's handoff samples, of which the estimator reads the latter where there are any, and
 * their tails; the point's earlier loss probes with the row's own.
 */
export function plannerLinks(
  pair: PeerPair,
  probe: RowProbe,
  samples: PointSamples,
  earlierLoss: readonly number[],
  atMs: number,
): LinkEstimator {
  const links = new LinkEstimator();
  links.recordRtt(pair, probe.rttMs, atMs);
  // One "transfer" per sample, its bytes over the time that rate takes (1 TB: never too small);
  // the estimator reads the probe only while no handoff sample is fresh.
  links.recordTransfer(pair, 1e12, 1e15 / probe.bandwidthBytesPerS, atMs, "probe");
  for (const r of samples.transfers) links.recordTransfer(pair, 1e12, 1e15 / r, atMs, "handoff");
  for (const r of samples.tails) links.recordTailTransfer(pair, 1e12, 1e15 / r, atMs);
  recordLossFractions(links, pair, [
    ...earlierLoss,
    ...(probe.lossFraction === null ? [] : [probe.lossFraction]),
  ], atMs);
  return links;
}

/** The point's handoff samples so far. */
export function pointTransfers(byPoint: Map<string, PointSamples>, p: LinkPoint): PointSamples {
  return byPoint.get(pointKey(p)) ?? { transfers: [], tails: [] };
}
