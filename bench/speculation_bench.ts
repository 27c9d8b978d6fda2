/**
 * Speculative decoding on a repetitive workload (a self-repeating prompt: the suffix proposer
 * fires on it), per decode mode: tokens/s of the decode loop and acceptance per source,
 * colocated vs after an in-process handoff (correctness/speculation.ts, the real staged
 * import; the verdict is checked there too). Every mode of a family runs in each repeat, one
 * after another, and the table shows medians over repeats, with each mode's speed-up over
 * target-only taken within the same repeat. Random-weight MTP heads accept almost nothing:
 * reported as measured.
 */
import { ensureModelFile, type Family } from "../models/mod.ts";
import {
  type DecodeMode,
  runSpeculationCase,
  type SpeculationCaseResult,
} from "../correctness/speculation.ts";
import type { ReportSection } from "./report.ts";
import { median, table } from "./stats.ts";
import { barChart } from "./svg.ts";

const CASES: [Family, DecodeMode[]][] = [
  ["hybrid", ["target-only", "suffix"]],
  ["hybrid-moe-mtp", ["target-only", "mtp", "suffix", "mtp+suffix"]],
];

/** One (family, mode) over all repeats. */
export interface SpeculationBenchRow {
  family: Family;
  mode: DecodeMode;
  /** Every repeat's verdict was exact (tokens equal colocated and target-only greedy). */
  exact: boolean;
  colocatedTokensPerSec: number;
  movedTokensPerSec: number;
  colocatedTokensPerCpuSec: number | null;
  movedTokensPerCpuSec: number | null;
  /**
   * Median over repeats of (this mode's tokens per CPU-second) / (target-only's in the same
   * repeat); wall-clock tok/s when no CPU clock is available.
   */
  speedupColocated: number;
  speedupMoved: number;
  /** Counters after the handoff (greedy: the same in every repeat, checked). */
  rounds: number;
  mtpAccepted: number;
  mtpDrafted: number;
  suffixAccepted: number;
  suffixDrafted: number;
  /** Counters varied between repeats (they must not: greedy and deterministic). */
  countersVaried: boolean;
  repeats: SpeculationCaseResult[];
}

/**
 * CPU seconds of this process's live threads (the sum of `/proc/self/task/<tid>/schedstat`, in
 * nanoseconds), or null without /proc. A decode loop of a tiny model takes tens of
 * milliseconds, below what /proc/self/stat's 10 ms ticks resolve; the loop's threads live
 * through it, so none of its CPU time is lost with an exited thread.
 */
function taskCpuSeconds(): number | null {
  try {
    let ns = 0;
    for (const task of Deno.readDirSync("/proc/self/task")) {
      try {
        ns += Number(Deno.readTextFileSync(`/proc/self/task/${task.name}/schedstat`).split(" ")[0]);
      } catch {
        // The thread exited between listing and reading: its time is gone either way.
      }
    }
    return ns / 1e9;
  } catch {
    return null;
  }
}

function rate(accepted: number, drafted: number): string {
  return drafted === 0 ? "-" : `${accepted}/${drafted}`;
}

function medianOrNull(values: (number | null)[]): number | null {
  const known = values.filter((v): v is number => v !== null);
  return known.length === values.length ? median(known) : null;
}

function summarize(runs: SpeculationCaseResult[], baseline: SpeculationCaseResult[]) {
  const ratio = (x: number | null, y: number | null) => (x ?? NaN) / (y ?? NaN);
  const colocated = (r: SpeculationCaseResult) =>
    r.colocatedTokensPerCpuSec ?? r.colocatedTokensPerSec;
  const moved = (r: SpeculationCaseResult) => r.movedTokensPerCpuSec ?? r.movedTokensPerSec;
  const c = runs[0].moved?.counters;
  const key = (r: SpeculationCaseResult) => JSON.stringify(r.moved?.counters ?? null);
  return {
    family: runs[0].family,
    mode: runs[0].mode,
    exact: runs.every((r) => r.ok),
    colocatedTokensPerSec: median(runs.map((r) => r.colocatedTokensPerSec ?? NaN)),
    movedTokensPerSec: median(runs.map((r) => r.movedTokensPerSec ?? NaN)),
    colocatedTokensPerCpuSec: medianOrNull(runs.map((r) => r.colocatedTokensPerCpuSec)),
    movedTokensPerCpuSec: medianOrNull(runs.map((r) => r.movedTokensPerCpuSec)),
    speedupColocated: median(
      runs.map((r, i) => ratio(colocated(r), colocated(baseline[i]))),
    ),
    speedupMoved: median(
      runs.map((r, i) => ratio(moved(r), moved(baseline[i]))),
    ),
    rounds: c?.rounds ?? 0,
    mtpAccepted: c?.mtpAccepted ?? 0,
    mtpDrafted: c?.mtpDrafted ?? 0,
    suffixAccepted: c?.suffixAccepted ?? 0,
    suffixDrafted: c?.suffixDrafted ?? 0,
    countersVaried: runs.some((r) => key(r) !== key(runs[0])),
    repeats: runs,
  };
}

/** Runs every case `repeats` times, cases interleaved within each repeat. */
export async function runSpeculationBench(
  o: { promptTokens: number; steps: number; repeats: number; copyTokens: number; modelDir: string },
): Promise<SpeculationBenchRow[]> {
  const byCase = new Map<string, SpeculationCaseResult[]>();
  for (let rep = 0; rep < o.repeats; rep++) {
    for (const [family, modes] of CASES) {
      for (const mode of modes) {
        const r = await runSpeculationCase(
          { family, preset: "tiny", promptTokens: o.promptTokens, chunkTokens: 512, mode },
          {
            steps: o.steps,
            // One thread: on a loaded 2-core machine two-thread graphs stall at barriers.
            threads: 1,
            copyTokens: o.copyTokens,
            cpuSeconds: taskCpuSeconds,
            modelFor: (f, preset) => ensureModelFile(o.modelDir, { family: f, preset, seed: 0 }),
          },
        );
        const key = `${family} ${mode}`;
        byCase.set(key, [...byCase.get(key) ?? [], r]);
      }
    }
  }
  const rows: SpeculationBenchRow[] = [];
  for (const [family, modes] of CASES) {
    const baseline = byCase.get(`${family} target-only`)!;
    for (const mode of modes) rows.push(summarize(byCase.get(`${family} ${mode}`)!, baseline));
  }
  return rows;
}

export async function speculationSection(
  o: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const promptTokens = o.quick ? 512 : 1024;
  const steps = o.quick ? 64 : 128;
  const repeats = o.quick ? 3 : 5;
  const copyTokens = 48;
  const rows = await runSpeculationBench({
    promptTokens,
    steps,
    repeats,
    copyTokens,
    modelDir: o.modelDir,
  });
  return {
    name: "speculation",
    rows,
    table: _speculationTable(rows),
    notes: _speculationNotes(promptTokens, copyTokens, steps, repeats),
    charts: _speculationCharts(rows, repeats),
  };
}

function _speculationTable(rows: SpeculationBenchRow[]): string {
  const fixed = (x: number | null, digits = 0) => x === null ? "-" : x.toFixed(digits);
  return table(
    [
      "family",
      "mode",
      "exact",
      "tok/s coloc",
      "tok/s handoff",
      "tok/CPU-s coloc",
      "tok/CPU-s handoff",
      "x coloc",
      "x handoff",
      "rounds",
      "mtp acc",
      "suffix acc",
    ],
    rows.map((r) => [
      r.family,
      r.mode,
      r.exact ? "yes" : "NO",
      fixed(r.colocatedTokensPerSec),
      fixed(r.movedTokensPerSec),
      fixed(r.colocatedTokensPerCpuSec),
      fixed(r.movedTokensPerCpuSec),
      fixed(r.speedupColocated, 2),
      fixed(r.speedupMoved, 2),
      r.rounds + (r.countersVaried ? " (varied)" : ""),
      rate(r.mtpAccepted, r.mtpDrafted),
      rate(r.suffixAccepted, r.suffixDrafted),
    ]),
  );
}

/** How the speculation rows were measured and how to read them. */
function _speculationNotes(
  promptTokens: number,
  copyTokens: number,
  steps: number,
  repeats: number,
): string[] {
  return [
    `Tiny random-weight models, ${promptTokens}-token self-repeating prompt (its head holds the target's own ${copyTokens}-token greedy continuation, which the suffix proposer can match once generation reaches it), ${steps} greedy tokens, 1 thread, per-session contexts; medians of ${repeats} repeats, all modes of a family one after another in each repeat.`,
    "tok/s: the decode loop after the first token, wall clock; the handoff column continues the same loop on the decoder's imported state (in-process staged import). tok/CPU-s: the same loops per CPU-second of this process (the sum of /proc/self/task/<tid>/schedstat), which does not depend on what else runs on the machine; on a loaded machine it is the column to read. x: a mode's tok/CPU-s over target-only's in the same repeat (median of the ratios).",
    "Acceptance is counted after the handoff (accepted/drafted per source; the same colocated, checked by the verdict). Random-weight MTP heads accept almost no drafts, so the MTP modes pay a draft decode per proposed token and a wider verify without the gain; the suffix proposer accepts where the text repeats, here the constructed repeat, and is silent elsewhere. In mtp+suffix a suffix match replaces the MTP prefix (MTP drafts are then not proposed, so not counted).",
    "exact: in every repeat the tokens after the handoff equal the colocated run's and target-only greedy decoding's, and the MTP drafts are bitwise equal.",
  ];
}

/** Tokens per CPU-second and acceptance per (family, mode). */
function _speculationCharts(rows: SpeculationBenchRow[], repeats: number): Record<string, string> {
  const label = (r: SpeculationBenchRow) => `${r.family} ${r.mode}`;
  return {
    "speculation-throughput.svg": barChart(rows.map(label), [
      {
        name: "colocated",
        values: rows.map((r) => r.colocatedTokensPerCpuSec ?? r.colocatedTokensPerSec),
      },
      {
        name: "after handoff",
        values: rows.map((r) => r.movedTokensPerCpuSec ?? r.movedTokensPerSec),
      },
    ], {
      title: `Decode tokens per CPU-second per speculation mode (median of ${repeats})`,
      xLabel: "family, mode",
      yLabel: "tokens / CPU-second",
    }),
    "speculation-acceptance.svg": barChart(rows.map(label), [
      {
        name: "MTP accepted / drafted",
        values: rows.map((r) => ratioOr0(r.mtpAccepted, r.mtpDrafted)),
      },
      {
        name: "suffix accepted / drafted",
        values: rows.map((r) => ratioOr0(r.suffixAccepted, r.suffixDrafted)),
      },
    ], {
      title: "Draft acceptance per source after the handoff",
      xLabel: "family, mode",
      yLabel: "accepted / drafted",
    }),
  };
}

function ratioOr0(accepted: number, drafted: number): number {
  return drafted === 0 ? 0 : accepted / drafted;
}
