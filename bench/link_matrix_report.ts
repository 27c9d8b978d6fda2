/**
 * The link matrix's report (bench/link_matrix.ts runs it): predictions replayed with the
 * planner as it now stands, each from only what the run had measured before that row (the
 * same-run calibration, the handoffs served earlier, the row's own pings and probe), next to
 * the measurement; a table, the share within 15%, and predicted-against-measured charts.
 *
 *   deno run -A bench/link_matrix_report.ts --out DIR [--without TERM,...] [--grid] run1.json [...]
 *
 * `--grid` reports the issue's whole grid instead of the runs one by one: each point from the run
 * that measured it most often (`link_matrix_grid.ts`), the points no run measured named as such,
 * the runs it read listed, and the count with every run's rows pooled per point (`pooledNote`),
 * a reading that chooses no run.
 * `--without` replays with those measured cost terms left out (HandoffCosts names, such as
 * `linkResidual` or `captureLeadMs`): what each term does to the count, side by side.
 */
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { replay, type Replayed, type RunFile } from "./_matrix_replay.ts";
import { type ReportSection, writeReport } from "./report.ts";
import {
  byPoint,
  pointSection,
  type PointSummary,
  predictionError as err,
  tailAgainstNoise,
  tailSplitHalves,
} from "./link_matrix_points.ts";
import { gridPoints, gridSection, pooledNote, type RunPoints } from "./link_matrix_grid.ts";
import { table } from "./stats.ts";
import { scatterChart } from "./svg.ts";

export { replay };
export type { Replayed };

const within = (xs: (number | null)[]) => {
  const v = xs.filter((x): x is number => x !== null);
  return `${v.filter((x) => Math.abs(x) <= 0.15).length}/${v.length}`;
};

/**
 * One run's line: its setup, the share of rows within 15%, and the noise floor (the previous
 * row's measurement, same prompt, as the prediction: on a quiet machine near-perfect for TTFT,
 * which does not depend on the link).
 */
function runNote(file: string, run: RunFile, r: Replayed[]): string {
  const prev = (pick: (x: Replayed) => [number, number] | null) =>
    r.map((x, k) => {
      const before = r.slice(0, k).reverse().find((y) =>
        y.row.promptTokens === x.row.promptTokens && pick(y)
      );
      const now = pick(x);
      return before && now ? pick(before)![1] / now[1] - 1 : null;
    });
  const loads = run.rows.map((x) => x.loadAvg1m).filter(Number.isFinite).sort((a, b) => a - b);
  const c = run.ceiling;
  const prompts = [...new Set(run.rows.map((x) => x.promptTokens))].join(", ");
  const threads = run.workerThreads ?? RUNTIME_DEFAULTS.threads;
  return `${run.rows[0]?.model} (${file.split("/").pop()}: prompts ${prompts}, ${
    threads === 1 ? "1 llama.cpp thread" : `${threads} llama.cpp threads`
  } per worker, ${
    run.pinWorkers === "split"
      ? "the prefill compute alone on CPU 0; its other threads, the relay and the decode " +
        "worker on CPU 1"
      : run.pinWorkers
      ? "each pinned to a CPU of its own"
      : "unpinned"
  }${
    // Runs from before the option sent with Cubic and do not say so.
    run.congestionControl
      ? `, the state sent with ${_ccName(run.congestionControl)}`
      : ""}): relay ${run.relay}, ceiling ${
    c ? (c.bitsPerS / 1e6).toFixed(0) : "?"
  } Mbit/s (best of trials ${
    (c?.trialsBitsPerS ?? []).map((b) => (b / 1e6).toFixed(0)).join(", ")
  }), RTT floor ${c?.rttFloorUsMedian.toFixed(0)} us; load average (1 min) over the rows ${
    loads[0]?.toFixed(1)
  }-${loads[loads.length - 1]?.toFixed(1)} on 2 cores; TTFT ${
    within(r.map((x) => err(x.ttft)))
  }, tail ${within(r.map((x) => err(x.tail)))}, link part ${
    within(r.map((x) => err(x.link)))
  }, TTFT + tail ${
    within(r.map((x) => err(x.ready)))
  } within 15%. Noise floor (previous row's measurement, same prompt, as the prediction): TTFT ${
    within(prev((x) => x.ttft))
  }, tail ${within(prev((x) => x.tail))}, link part ${within(prev((x) => x.link))}. ${
    _bySource(r)
  }`;
}

/**
 * The tails by where their bandwidth came from: a point's first handoff plans from its probe,
 * the later ones from the point's handoffs, as a live pair does once it has served one.
 */
function _bySource(r: Replayed[]): string {
  const from = (s: Replayed["bandwidthFrom"]) => r.filter((x) => x.bandwidthFrom === s);
  const warm = from("handoff");
  if (warm.length === 0) return "Every row planned from its probe.";
  const points = byPoint(warm);
  return `Tails planned from the probe (each point's first handoff) ${
    within(from("probe").map((x) => err(x.tail)))
  }, from the point's own earlier handoffs ${
    within(warm.map((x) => err(x.tail)))
  } within 15%; per grid point over the latter alone (${points.length} points): tail ${
    within(points.map((p) => err(p.tail)))
  }, TTFT ${within(points.map((p) => err(p.ttft)))}.`;
}

/**
 * A run with repeats, per grid point: the medians within 15%, and the measurement's own noise
 * (every repeat's TTFT within 15% of its point's median; the point's previous repeat as a
 * prediction of the next; the tail's misses against the points' own spread and the measurement
 * split in halves, `noiseNote`).
 */
function pointsNote(r: Replayed[], points: PointSummary[]): string {
  const samePoint = r.map((x, k) => {
    const before = r.slice(0, k).reverse().find((y) =>
      y.row.model === x.row.model && y.row.promptTokens === x.row.promptTokens &&
      y.row.rateBitsPerS === x.row.rateBitsPerS && y.row.rttMs === x.row.rttMs &&
      y.row.lossFraction === x.row.lossFraction && y.tail
    );
    return before && x.tail ? before.tail![1] / x.tail[1] - 1 : null;
  });
  const steady = (v: (number | null)[]) =>
    `${v.filter((x) => x !== null && x <= 0.15).length}/${v.filter((x) => x !== null).length}`;
  const repeats = Math.max(...points.map((p) => p.repeats));
  return `${
    r[0]?.row.model
  }, per grid point (${points.length} points, medians over up to ${repeats} repeats): TTFT ${
    within(points.map((p) => err(p.ttft)))
  }, tail ${within(points.map((p) => err(p.tail)))}, link part ${
    within(points.map((p) => err(p.link)))
  }, TTFT + tail ${
    within(points.map((p) => err(p.ready)))
  } within 15%. The measurement's own noise: every repeat's TTFT within 15% of its point's median at ${
    steady(points.map((p) => p.ttftSpread))
  } points; the same point's previous repeat, as a prediction of the next, within 15% for ${
    within(samePoint)
  } tails. ${noiseNote(points)}`;
}

/** Whether the tails the prediction misses are points the measurement itself cannot pin down. */
function noiseNote(points: PointSummary[]): string {
  const n = tailAgainstNoise(points);
  return `Of the ${n.points} points with two or more tails, ${n.steady} had every repeat within 15% of their median, and the prediction is within 15% at ${n.steadyMet} of those; of the ${
    n.points - n.met
  } points it misses, ${n.missedNoisy} are points whose own repeats spread beyond 15%.${
    _halvesNote(points)
  }`;
}

/** The measurement against itself (`tailSplitHalves`), where points have four or more tails. */
function _halvesNote(points: PointSummary[]): string {
  const h = tailSplitHalves(points);
  if (h.points === 0) return "";
  return ` Split in halves (odd repeats against even) at the ${h.points} points with four or more tails, the measurement agrees with itself within 15% at ${h.halvesAgree}; the prediction is within 15% of a half at ${h.predictionMeetsHalf} of the ${
    2 * h.points
  } halves, and of all the tails at ${h.predictionMeets} points.`;
}

/** The row table: every handoff's replayed prediction beside its measurement, and charts. */
function rowSection(all: Replayed[], notes: string[]): ReportSection {
  const f = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(0));
  const pct = (x: [number, number] | null) => {
    const e = err(x);
    return e === null ? "-" : `${(e * 100).toFixed(0)}%`;
  };
  const pm = (x: [number, number] | null) => (x ? `${f(x[0])}/${f(x[1])}` : "-");
  const rows = all.map((x) => [
    x.row.model,
    `${x.row.rateBitsPerS / 1e6}M ${x.row.rttMs}ms ${x.row.lossFraction * 100}%`,
    x.row.promptTokens,
    x.row.loadAvg1m.toFixed(1),
    x.row.link.bytesPerS ? (x.row.link.bytesPerS / 1e6).toFixed(1) : "-",
    pm(x.ttft),
    pct(x.ttft),
    pm(x.tail),
    pct(x.tail),
    pm(x.link),
    pct(x.link),
    pm(x.probe),
    x.row.relay ? `${x.row.relay.lateUsMean.toFixed(0)}` : "-",
    x.row.relay?.drops ?? "-",
    x.row.refused ?? x.row.decision ?? "",
  ]);
  const series = (pick: (x: Replayed) => [number, number] | null) =>
    [...new Set(all.map((x) => x.row.model))].map((model) => ({
      name: model,
      points: all.filter((x) => x.row.model === model).map(pick).filter((p) => p !== null)
        .map((p) => ({ x: p![0], y: p![1] })),
    }));
  const chart = (title: string, pick: (x: Replayed) => [number, number] | null) =>
    scatterChart(series(pick), { title, xLabel: "predicted ms", yLabel: "measured ms" });
  return {
    name: "link-matrix",
    rows: all.map((x) => ({ ...x.row, telemetry: undefined, replay: { ...x, row: undefined } })),
    table: table([
      "model",
      "link",
      "prompt",
      "load",
      "probe MB/s",
      "TTFT p/m",
      "err",
      "tail p/m",
      "err",
      "link part p/m",
      "err",
      "dec. probe p/m",
      "relay late us",
      "drops",
      "planner / refused",
    ], rows),
    notes,
    charts: {
      "ttft.svg": chart("TTFT: predicted vs measured (ms)", (x) => x.ttft),
      "tail.svg": chart(
        "Tail (prefill end to CommitAck): predicted vs measured (ms)",
        (x) => x.tail,
      ),
      "link-part.svg": chart(
        "Prefill end to manifest at the decoder: predicted vs measured (ms)",
        (x) => x.link,
      ),
    },
  };
}

const USAGE =
  "deno run -A bench/link_matrix_report.ts [--out DIR] [--without TERM,...] [--grid] RUN.json...";

if (import.meta.main) {
  const args = [...Deno.args];
  if (args.length === 0 || args.includes("--help") || args.includes("-h")) {
    console.log(
      `${USAGE}\n(RUN.json: files bench/link_matrix.ts --out wrote; the report replays them)`,
    );
    Deno.exit(args.length === 0 ? 2 : 0);
  }
  const k = args.indexOf("--out");
  const outDir = k >= 0 ? args.splice(k, 2)[1] : "reports/link-matrix";
  const w = args.indexOf("--without");
  const without = w >= 0 ? args.splice(w, 2)[1].split(",") : [];
  const g = args.indexOf("--grid");
  const grid = g >= 0 && args.splice(g, 1).length > 0;
  const all: Replayed[] = [];
  const runs: RunPoints[] = [];
  const allPoints: PointSummary[] = [];
  const notes: string[] = [];
  for (const f of args) {
    const run = await readRun(f);
    const r = replay(run, without);
    all.push(...r);
    const points = byPoint(r);
    runs.push({ file: f, points });
    if (grid) continue; // the grid reads points only: no per-run notes
    notes.push(runNote(f, run, r));
    if (points.some((p) => p.repeats > 1)) {
      allPoints.push(...points);
      notes.push(pointsNote(r, points));
    }
  }
  if (args.length > 1 && allPoints.length) {
    notes.push(`Every run together: ${noiseNote(allPoints)}`);
  }
  notes.push(
    `Predictions replayed with the current planner from what each run had measured before the row${
      without.length ? `, without the measured ${without.join(", ")}` : ""
    }; what the misses mean, and the Cubic/BBR and link-only checks: FINDINGS.md.`,
  );
  if (grid) {
    const points = gridPoints(runs);
    const section = gridSection(points);
    // The points as read, in the runs' own per-point table and charts (bars: each point's range).
    const read = pointSection(points.flatMap((p) => (p.point ? [p.point] : [])));
    // The runs read, so the count can be read again from the same files.
    const files = runs.map((r) => r.file.split("/").pop()).join(", ");
    await writeReport(outDir, "Cost model against emulated links: the whole grid", [
      {
        ...section,
        notes: [
          ...section.notes!,
          pooledNote(byPoint(all)),
          `Runs read (${runs.length}): ${files}.`,
          ...notes,
        ],
      },
      read,
    ]);
    console.log(section.notes!.join("\n"));
  } else {
    await writeReport(outDir, "Cost model against emulated links", [
      rowSection(all, notes),
      ...(allPoints.length ? [pointSection(allPoints)] : []),
    ]);
    console.log(notes.join("\n"));
  }
  console.log(`report: ${outDir}/README.md`);
}

async function readRun(f: string): Promise<RunFile> {
  try {
    return JSON.parse(await Deno.readTextFile(f)) as RunFile;
  } catch (error) {
    console.error(
      `Cannot read run file ${f}: ${(error as Error).message}\n` +
        `give files bench/link_matrix.ts --out wrote; usage: ${USAGE}`,
    );
    Deno.exit(2);
  }
}

function _ccName(cc: "cubic" | "bbr"): string {
  return cc === "bbr" ? "BBR" : "Cubic";
}
