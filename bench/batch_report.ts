/**
 * The `batch` bench section's table, notes and chart (the runs are in batch_bench.ts).
 */
import type { ReportSection } from "./report.ts";
import { table } from "./stats.ts";
import { barChart } from "./svg.ts";
import { type BatchBenchRow, runBatchBench } from "./batch_bench.ts";

/** The `batch` section of `deno task bench`: table, notes and the throughput chart. */
export async function batchSection(
  { quick, modelDir }: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const { rows, nodeSkipped } = await runBatchBench({
    modelDir,
    families: quick ? ["hybrid"] : ["dense", "hybrid"],
    concurrency: [1, 4, 16],
    requests: 16,
    decodeTokens: quick ? 32 : 64,
    repeats: quick ? 1 : 3,
    threads: 1,
    nodeLlamaCpp: true,
  });
  return {
    name: "batch",
    rows,
    table: _batchTable(rows),
    notes: _batchNotes(nodeSkipped),
    charts: { "batch-throughput.svg": _batchChart(rows) },
  };
}

function _batchTable(rows: BatchBenchRow[]): string {
  return table(
    [
      "family",
      "streams",
      "batched tok/s",
      "one-at-a-time tok/s",
      "ratio",
      "tok/CPU-s batched",
      "tok/CPU-s one-at-a-time",
      "CPU ratio",
      "token agreement",
      "logits bitwise",
      "steps/token",
      "node-llama-cpp tok/s",
      "node-llama-cpp tok/CPU-s",
      "ours / node-llama-cpp",
      "ours / node-llama-cpp per CPU-s",
      "agreement with node-llama-cpp",
    ],
    rows.map((r) => [
      r.family,
      r.concurrency,
      r.batchedTokensPerSec,
      r.sequentialTokensPerSec,
      r.ratio,
      r.batchedTokensPerCpuSec,
      r.sequentialTokensPerCpuSec,
      r.cpuRatio,
      r.tokenAgreement,
      r.logitsBitwiseEqual,
      r.stepsPerDecodeToken,
      r.nodeTokensPerSec ?? "skipped",
      r.nodeTokensPerCpuSec ?? "skipped",
      r.nodeRatio ?? "skipped",
      r.nodeCpuRatio ?? "skipped",
      r.nodeTokenAgreement ?? "skipped",
    ]),
  );
}

/** How the batch rows were measured, and the node-llama-cpp comparison (or why it was skipped). */
function _batchNotes(nodeSkipped: string | null): string[] {
  return [
    "Decode throughput on one decode worker's shared context (the loop `serve --role decode` runs with --batching on), in process: tokens/s summed over streams, decode phase only (each wave's prompts prefilled first), 16 requests of 32 to 480 prompt tokens in waves of `streams`; one-at-a-time: the same requests decoded one after another on a context of their own. Medians of repeats, each batched run measured right after its one-at-a-time run; tiny random-weight models, 1 thread (a loaded 2-core machine stalls two-thread graphs at barriers).",
    "tok/CPU-s: decode tokens per CPU-second of the bench process (user + system, /proc/self/stat): on a machine shared with other work this does not depend on how much CPU the others take; wall-clock tok/s does.",
    "Exactness under batching: token agreement counts greedy tokens equal to the one-at-a-time run up to each stream's first divergence; logits bitwise is the share of logits rows equal bit for bit. Batched decode is NOT bitwise exact on this build (rows differ in the last bits, ~3e-7); a sequence decoded alone in the shared context is (serve/batch_loop_test.ts), which is where the handoff probe and --probe requests run.",
    nodeSkipped === null
      ? "node-llama-cpp 3.21.1 (installed at bench time into .cache/node-llama-cpp, not a project dependency; bench/node_llama_cpp_run.mjs under `node`) runs the same model file, the same 16 requests (token ids), 1 thread, the same per-sequence context (1,024 cells, `streams` sequences of one context, its own batching), greedy, and the same llama.cpp build (its prebuilt @node-llama-cpp/<platform>@3.21.1, which this project loads too). Decode phase only: each wave's prompts but their last token are evaluated first, then the clock runs while each sequence evaluates its last prompt token and generates (one decode more per stream than ours, which samples its first token from the prefill's logits). ours / node-llama-cpp: our batched tok/s over its tok/s, measured in the same run (node-llama-cpp first, then ours; noisy on a shared machine, see tok/CPU-s). Agreement: greedy tokens equal to our batched run's, up to each stream's first divergence."
      : `node-llama-cpp comparison skipped: ${nodeSkipped}.`,
  ];
}

function _batchChart(rows: BatchBenchRow[]): string {
  const nodeRan = rows.some((r) => r.nodeTokensPerSec !== null);
  const label = (r: BatchBenchRow) => `${r.family} c=${r.concurrency}`;
  return barChart(rows.map(label), [
    { name: "batched", values: rows.map((r) => r.batchedTokensPerSec) },
    { name: "one at a time", values: rows.map((r) => r.sequentialTokensPerSec) },
    ...(nodeRan
      ? [{ name: "node-llama-cpp", values: rows.map((r) => r.nodeTokensPerSec ?? 0) }]
      : []),
  ], {
    title: "Decode tokens/s summed over streams, one decode worker",
    xLabel: "family, concurrent streams",
    yLabel: "tokens/s",
  });
}
