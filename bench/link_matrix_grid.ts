/**
 * The issue's whole grid read over many link-matrix runs (`link_matrix_report.ts --grid`):
 * each grid point from the run that measured it with the most handoffs. Where two or more runs
 * tie on that count, the point is met only if it is met in every one of them, and the table
 * shows the worst of them, so the count does not depend on the order the runs are given in.
 * Grid points no run measured are listed as such, never left out.
 */
import { pointCells, type PointSummary, predictionError } from "./link_matrix_points.ts";
import type { ReportSection } from "./report.ts";
import { table } from "./stats.ts";
import { scatterChart } from "./svg.ts";

/** The grid the placement issue asks for (links x prompts per model); `link_matrix.ts` runs it by default. */
export const ISSUE_GRID = {
  ratesBitsPerS: [100e6, 400e6, 1e9],
  rttsMs: [0.2, 2, 10],
  lossFractions: [0, 0.001],
  prompts: { "super-mini": [512, 2048, 8192, 32768], "lab-state": [512, 2048, 4096] } as Record<
    string,
    number[]
  >,
};

/** One run's grid points, as `byPoint` made them from its replay. */
export interface RunPoints {
  file: string;
  points: PointSummary[];
}

/** One grid point: the run read (the worst of those tied), and whether every tied run meets it. */
export interface GridPoint {
  key: string;
  model: string;
  promptTokens: number;
  linkPoint: string;
  /** The point as read (null: no run measured a tail there). */
  point: PointSummary | null;
  /** The run read, and every run that measured as many tails there. */
  file: string | null;
  tiedFiles: string[];
  tailMet: boolean | null;
  ttftMet: boolean | null;
}

const within = (x: [number, number] | null, tolerance: number) => {
  const e = predictionError(x);
  return e !== null && Math.abs(e) <= tolerance;
};

/** Every point of `grid`, each read from the runs with the most measured tails there. */
export function gridPoints(
  runs: readonly RunPoints[],
  grid = ISSUE_GRID,
  tolerance = 0.15,
): GridPoint[] {
  const out: GridPoint[] = [];
  for (const [model, prompts] of Object.entries(grid.prompts)) {
    for (const promptTokens of prompts) {
      for (const rate of grid.ratesBitsPerS) {
        for (const rtt of grid.rttsMs) {
          for (const loss of grid.lossFractions) {
            const key = `${model}|${rate}|${rtt}|${loss}|${promptTokens}`;
            const linkPoint = `${rate / 1e6}M ${rtt}ms ${loss * 100}%`;
            out.push({ key, model, promptTokens, linkPoint, ..._read(runs, key, tolerance) });
          }
        }
      }
    }
  }
  return out;
}

function _read(runs: readonly RunPoints[], key: string, tolerance: number) {
  const found = runs.flatMap((r) =>
    r.points.filter((p) => p.key === key && p.tail !== null).map((point) => ({
      file: r.file,
      point,
    }))
  );
  const most = Math.max(0, ...found.map((c) => c.point.tailsMs.length));
  const tied = found.filter((c) => c.point.tailsMs.length === most);
  if (tied.length === 0) {
    return { point: null, file: null, tiedFiles: [], tailMet: null, ttftMet: null };
  }
  const worst = tied.reduce((a, b) =>
    Math.abs(predictionError(b.point.tail)!) > Math.abs(predictionError(a.point.tail)!) ? b : a
  );
  return {
    point: worst.point,
    file: worst.file,
    tiedFiles: tied.map((c) => c.file),
    tailMet: tied.every((c) => within(c.point.tail, tolerance)),
    ttftMet: tied.every((c) => within(c.point.ttft, tolerance)),
  };
}

/** The counts a note states: points met, measured, tied, and the misses by their own noise. */
export function gridCounts(points: readonly GridPoint[], tolerance = 0.15) {
  const measured = points.filter((p) => p.point !== null);
  const misses = measured.filter((p) => !p.tailMet);
  return {
    points: points.length,
    measured: measured.length,
    tailMet: measured.filter((p) => p.tailMet).length,
    ttftMet: measured.filter((p) => p.ttftMet).length,
    tied: measured.filter((p) => p.tiedFiles.length > 1).length,
    missesNoisy: misses.filter((p) => (p.point!.tailSpread ?? 0) > tolerance).length,
    misses: misses.length,
  };
}

const _tied = (g: GridPoint) =>
  g.tiedFiles.length > 1 ? ` (${g.tiedFiles.length - 1} more tied)` : "";

/** The grid as a report section: one line per point, the counts, and TTFT per point. */
export function gridSection(points: GridPoint[]): ReportSection {
  const c = gridCounts(points);
  const { pm, pct, spread } = pointCells;
  const verdict = (met: boolean | null) => (met === null ? "not measured" : met ? "yes" : "no");
  const rows = points.map((g) => [
    g.model,
    g.promptTokens,
    g.linkPoint,
    g.point?.tailsMs.length ?? 0,
    pm(g.point?.ttft ?? null),
    pct(g.point?.ttft ?? null),
    verdict(g.ttftMet),
    pm(g.point?.tail ?? null),
    pct(g.point?.tail ?? null),
    spread(g.point?.tailSpread ?? null),
    verdict(g.tailMet),
    g.file ? `${g.file.split("/").pop()}${_tied(g)}` : "-",
  ]);
  const ttft = scatterChart(
    Object.keys(ISSUE_GRID.prompts).map((model) => ({
      name: model,
      points: points.filter((g) => g.model === model && g.point?.ttft).map((g) => ({
        x: g.point!.ttft![0],
        y: g.point!.ttft![1],
      })),
    })),
    {
      title: "TTFT per grid point: median predicted vs median measured (ms)",
      xLabel: "median predicted ms",
      yLabel: "median measured ms",
    },
  );
  return {
    name: "link-matrix-grid",
    rows: points,
    table: table([
      "model",
      "prompt",
      "link",
      "n",
      "TTFT p/m",
      "err",
      "TTFT met",
      "tail p/m",
      "err",
      "tail spread",
      "tail met",
      "run",
    ], rows),
    notes: [
      `The issue's grid (${c.points} points): measured at ${c.measured}; the tail within 15% at ${c.tailMet}, TTFT at ${c.ttftMet}. Each point is read from the run that measured it with the most handoffs (n); at ${c.tied} points two or more runs tie on n, and such a point counts as met only if every tied run meets it (the table shows the worst). ${
        c.misses
          ? `Of the ${c.misses} tail misses, ${c.missesNoisy} are at points whose own repeats spread beyond 15% of their median (tail spread).`
          : "No point misses the tail."
      } The tail per point, with the range of its repeats, is the chart of the next section (tail-points.svg).`,
    ],
    // The tail per point, with each point's range, is the points section's chart below.
    charts: { "grid-ttft.svg": ttft },
  };
}

/**
 * The grid read with every run's rows pooled per point (`pooled`: `byPoint` over all the runs'
 * replayed rows), as a note. It chooses no run, so unlike `gridPoints` it does not favour the
 * runs that measured a point again because it missed; it mixes runs of different days and
 * layouts, which is why the grid itself reads one run per point.
 */
export function pooledNote(pooled: readonly PointSummary[], tolerance = 0.15): string {
  const points = gridPoints([{ file: "every run", points: [...pooled] }], ISSUE_GRID, tolerance);
  const c = gridCounts(points, tolerance);
  const misses = points.flatMap((g) =>
    g.point && !g.tailMet
      ? [
        `${g.model} ${g.promptTokens} ${g.linkPoint} ${
          pointCells.pct(g.point.tail)
        } (n ${g.point.repeats})`,
      ]
      : []
  );
  return `Every run's rows pooled per point (medians over all of a point's rows, whichever run measured them): the tail within 15% at ${c.tailMet} of ${c.measured}, TTFT at ${c.ttftMet}${
    misses.length ? `; the tail misses: ${misses.join(", ")}` : ""
  }.`;
}
