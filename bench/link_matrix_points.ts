/**
 * The link matrix's grid points over their repeats (bench/link_matrix_report.ts): the median
 * prediction beside the median measurement per point, and how far the point's own
 * measurements spread, with a table and a chart whose bars show each point's range.
 */
import type { Replayed } from "./link_matrix_report.ts";
import type { ReportSection } from "./report.ts";
import { median, table } from "./stats.ts";
import { scatterChart } from "./svg.ts";

/**
 * One grid point over its repeats: the median prediction beside the median measurement, and
 * how far the point's own measurements spread around their median (the noise any prediction
 * of one handoff there is judged against).
 */
export interface PointSummary {
  key: string;
  model: string;
  promptTokens: number;
  /** The emulated link, as the table names it. */
  linkPoint: string;
  repeats: number;
  ttft: [pred: number, meas: number] | null;
  tail: [pred: number, meas: number] | null;
  /** Prefill end to the manifest at the decoder. */
  link: [pred: number, meas: number] | null;
  /** TTFT plus the tail: the request's start to the decoder owning the state. */
  ready: [pred: number, meas: number] | null;
  /** The largest |measurement / median - 1| among the repeats' tails (null below 2 repeats). */
  tailSpread: number | null;
  ttftSpread: number | null;
  /** The repeats' measured tails, in run order (ms). */
  tailsMs: number[];
}

/** Groups replayed rows by grid point (model, link, prompt) and takes medians over repeats. */
export function byPoint(rows: readonly Replayed[]): PointSummary[] {
  const groups = new Map<string, Replayed[]>();
  for (const x of rows) {
    const r = x.row;
    const key = `${r.model}|${r.rateBitsPerS}|${r.rttMs}|${r.lossFraction}|${r.promptTokens}`;
    groups.set(key, [...(groups.get(key) ?? []), x]);
  }
  const med = (xs: Replayed[], pick: (x: Replayed) => [number, number] | null) => {
    const v = xs.map(pick).filter((p): p is [number, number] => p !== null);
    return v.length
      ? [median(v.map((p) => p[0])), median(v.map((p) => p[1]))] as [number, number]
      : null;
  };
  const spread = (xs: Replayed[], pick: (x: Replayed) => [number, number] | null) => {
    const m = xs.map(pick).filter((p): p is [number, number] => p !== null).map((p) => p[1]);
    if (m.length < 2) return null;
    const mid = median(m);
    return Math.max(...m.map((v) => Math.abs(v / mid - 1)));
  };
  return [...groups].map(([key, xs]) => {
    const r = xs[0].row;
    return {
      key,
      model: r.model,
      promptTokens: r.promptTokens,
      linkPoint: `${r.rateBitsPerS / 1e6}M ${r.rttMs}ms ${r.lossFraction * 100}%`,
      repeats: xs.length,
      ttft: med(xs, (x) => x.ttft),
      tail: med(xs, (x) => x.tail),
      link: med(xs, (x) => x.link),
      ready: med(xs, (x) => x.ready),
      tailSpread: spread(xs, (x) => x.tail),
      ttftSpread: spread(xs, (x) => x.ttft),
      tailsMs: xs.map((x) => x.tail?.[1]).filter((v): v is number => v !== undefined),
    };
  });
}

/** A prediction's error against its measurement (0.1: 10% over); null without a pair. */
export const predictionError = (x: [number, number] | null) => (x ? x[0] / x[1] - 1 : null);

/**
 * The median tails against the points' own noise: of the points with two or more measured
 * tails, those whose repeats all lie within `tolerance` of their median (`steady`) and how many
 * of these the prediction meets, and how many points the prediction misses where the repeats
 * themselves spread beyond `tolerance` (`missedNoisy`): a miss there says as much of the
 * measurement as of the model.
 */
export function tailAgainstNoise(
  points: readonly PointSummary[],
  tolerance = 0.15,
): { points: number; met: number; steady: number; steadyMet: number; missedNoisy: number } {
  const measured = points.filter((p) => p.tail !== null && p.tailSpread !== null);
  const met = (p: PointSummary) => Math.abs(predictionError(p.tail)!) <= tolerance;
  const steady = measured.filter((p) => p.tailSpread! <= tolerance);
  return {
    points: measured.length,
    met: measured.filter(met).length,
    steady: steady.length,
    steadyMet: steady.filter(met).length,
    missedNoisy: measured.filter((p) => !met(p) && p.tailSpread! > tolerance).length,
  };
}

/**
 * The measurement against itself: at each point with four or more measured tails, the median
 * of its odd repeats (first, third, ...) beside the median of its even ones, alternating so
 * that a drift over the run falls in both halves. `halvesAgree` counts the points whose two
 * halves lie within `tolerance` of each other (the most any prediction of a point's median can
 * be expected to meet where the measurement repeats no better), `predictionMeetsHalf` the
 * halves the point's median prediction is within `tolerance` of (two per point), and
 * `predictionMeets` the points where it is within `tolerance` of the median of all the tails.
 */
export function tailSplitHalves(
  points: readonly PointSummary[],
  tolerance = 0.15,
): { points: number; halvesAgree: number; predictionMeetsHalf: number; predictionMeets: number } {
  const within = (pred: number, meas: number) =>
    Math.abs(predictionError([pred, meas])!) <= tolerance;
  const out = { points: 0, halvesAgree: 0, predictionMeetsHalf: 0, predictionMeets: 0 };
  for (const p of points) {
    if (p.tail === null || p.tailsMs.length < 4) continue;
    const odd = median(p.tailsMs.filter((_, i) => i % 2 === 0));
    const even = median(p.tailsMs.filter((_, i) => i % 2 === 1));
    out.points++;
    if (within(odd, even)) out.halvesAgree++;
    out.predictionMeetsHalf += [odd, even].filter((h) => within(p.tail![0], h)).length;
    if (within(p.tail[0], p.tail[1])) out.predictionMeets++;
  }
  return out;
}

/** The per-point table: medians over the repeats, and the spread of the measured tails. */
export function pointSection(points: PointSummary[]): ReportSection {
  return {
    name: "link-matrix-points",
    rows: points,
    table: _pointTable(points),
    notes: [
      "Each grid point over its repeats: the median of the replayed predictions beside the median of the measurements (p/m, ms), and the spread: the largest distance of one repeat's measurement from the point's median.",
      "TTFT+tail: the request's start to the decoder owning the state (the tail alone is what remains of the transfer after a prefill whose length varies; the sum is what the link fixes).",
    ],
    charts: _pointCharts(points),
  };
}

/** The per-point tables' cells: "p/m" in ms, an error or a spread in percent, "-" for none. */
export const pointCells = {
  pm: (x: [number, number] | null) => (x ? `${x[0].toFixed(0)}/${x[1].toFixed(0)}` : "-"),
  pct: (x: [number, number] | null) => pointCells.spread(predictionError(x)),
  spread: (v: number | null) => (v === null ? "-" : `${(v * 100).toFixed(0)}%`),
};

/** One line per grid point: predicted/measured medians, their errors and spreads. */
function _pointTable(points: PointSummary[]): string {
  const { pm, pct, spread } = pointCells;
  const f = (v: number) => v.toFixed(0);
  return table(
    [
      "model",
      "link",
      "prompt",
      "n",
      "TTFT p/m",
      "err",
      "TTFT spread",
      "tail p/m",
      "err",
      "tail spread",
      "measured tails ms",
      "link part p/m",
      "err",
      "TTFT+tail p/m",
      "err",
    ],
    points.map((p) => [
      p.model,
      p.linkPoint,
      p.promptTokens,
      p.repeats,
      pm(p.ttft),
      pct(p.ttft),
      spread(p.ttftSpread),
      pm(p.tail),
      pct(p.tail),
      spread(p.tailSpread),
      p.tailsMs.map(f).join(", "),
      pm(p.link),
      pct(p.link),
      pm(p.ready),
      pct(p.ready),
    ]),
  );
}

/** Median predicted against median measured per point: TTFT + tail, and the tail with its range. */
function _pointCharts(points: PointSummary[]): Record<string, string> {
  return {
    "ready-points.svg": _pointsChart(
      points,
      (p) => p.ready && { x: p.ready[0], y: p.ready[1] },
      "TTFT + tail per grid point: median predicted vs median measured (ms)",
    ),
    "tail-points.svg": _pointsChart(
      points,
      (p) =>
        p.tail && {
          x: p.tail[0],
          y: p.tail[1],
          yLow: Math.min(...p.tailsMs),
          yHigh: Math.max(...p.tailsMs),
        },
      "Tail per grid point: median predicted vs median measured (ms), bar: range",
    ),
  };
}

type ChartPoint = { x: number; y: number; yLow?: number; yHigh?: number };

/** Predicted against measured per grid point, one series per model. */
function _pointsChart(
  points: PointSummary[],
  pick: (p: PointSummary) => ChartPoint | null,
  title: string,
): string {
  return scatterChart(
    [...new Set(points.map((p) => p.model))].map((model) => ({
      name: model,
      points: points.filter((p) => p.model === model).map(pick).filter((c) => c !== null),
    })),
    { title, xLabel: "predicted ms", yLabel: "measured ms" },
  );
}
