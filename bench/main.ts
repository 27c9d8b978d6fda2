/**
 * `deno task bench [--only model,state,transport,handoff,lab,payload,speculation,batch,link,prefix] [--quick] [--out DIR]`
 *
 * Runs the benchmark sections, prints their tables and writes a report folder with SVG charts
 * (default `reports/bench-<timestamp>`). Benchmarks are never asserted in the test suite.
 */
import { parseArgs } from "node:util";
import { cacheDir } from "../cli/paths.ts";
import { barChart } from "./svg.ts";
import { type ReportSection, writeReport } from "./report.ts";
import { table } from "./stats.ts";
import { runModelBench } from "./model_bench.ts";
import { stateBenchSection } from "./state_bench.ts";
import { formatTransportBench, runTransportBench } from "./transport_bench.ts";
import { runHandoffBench } from "./handoff_bench.ts";
import { labTailSection, payloadSection } from "./lab_tail_bench.ts";
import { speculationSection } from "./speculation_bench.ts";
import { linkSection } from "./link_report.ts";
import { calibrateMain } from "./calibrate.ts";
import { lineChart } from "./svg.ts";
import { runBatchBench } from "./batch_bench.ts";
import { prefixSection } from "./prefix_bench.ts";

type Section = (o: { quick: boolean; modelDir: string }) => Promise<ReportSection>;

const SECTIONS: Record<string, Section> = {
  lab: (o) => labTailSection(o),
  payload: (o) => payloadSection(o),
  speculation: (o) => speculationSection(o),
  link: (o) => linkSection(o),
  transport: async ({ quick }) => {
    const r = await runTransportBench({ transferMiB: quick ? 32 : 128, repeats: quick ? 2 : 3 });
    return {
      name: "transport",
      rows: r,
      table: formatTransportBench(r),
      notes: ["Sender and receiver in one process on loopback; the ratio is what matters."],
      charts: {
        "transport-throughput.svg": barChart(["raw QUIC", "framed + credited"], [
          { name: "MB/s (median)", values: [r.rawMBpsMedian, r.framedMBpsMedian] },
        ], { title: "One QUIC stream, 1 MiB pages", xLabel: "path", yLabel: "MB/s" }),
      },
    };
  },
  handoff: async ({ quick, modelDir }) => {
    const r = await runHandoffBench({
      modelDir,
      promptTokens: quick ? [1024, 4096] : [1024, 4096, 16384],
      repeats: quick ? 1 : 3,
    });
    const p = r.payload;
    return {
      name: "handoff",
      rows: r,
      table: table(
        [
          "prompt",
          "state MB",
          "prefill ms",
          "overlap",
          "staged early",
          "tail ms",
          "TTFT disagg ms",
          "TTFT coloc ms",
        ],
        r.rows.map((x) => [
          x.promptTokens,
          x.stateBytes / 1e6,
          x.prefillMs,
          x.overlapFraction,
          x.stagedEarlyFraction,
          x.uncoveredTailMs,
          x.ttftDisaggregatedMs,
          x.ttftColocatedMs,
        ]),
      ),
      notes: [
        `${r.family} ${r.preset}; two worker processes and the client share 2 cores on loopback, so TTFT disaggregated cannot beat colocated here: this measures the handoff's cost.`,
        `Payload path (${
          (p.stateBytes / 1e6).toFixed(1)
        } MB of real KV pages, ${p.pages} pages of ${p.pageTokens} tokens: binding tag, framing, credit, CRC-32C check, append-import): ${
          p.payloadMBps.toFixed(0)
        } MB/s vs raw QUIC ${p.rawMBps.toFixed(0)} MB/s in the same run, ratio ${
          p.ratio.toFixed(2)
        }.`,
        `Authentication + capabilities: ${
          r.transport.authenticationMsMedian.toFixed(2)
        } ms per connection; framing encode ${r.transport.encodeMBps.toFixed(0)} MB/s, decode ${
          r.transport.decodeMBps.toFixed(0)
        } MB/s.`,
      ],
      charts: {
        "handoff-payload.svg": barChart(["raw QUIC", "handoff payload path"], [
          { name: "MB/s (median)", values: [p.rawMBps, p.payloadMBps] },
        ], { title: "Same bytes, same run", xLabel: "path", yLabel: "MB/s" }),
        "handoff-ttft.svg": barChart(r.rows.map((x) => String(x.promptTokens)), [
          { name: "disaggregated", values: r.rows.map((x) => x.ttftDisaggregatedMs) },
          { name: "colocated", values: r.rows.map((x) => x.ttftColocatedMs) },
        ], {
          title: "Time to first token on one 2-core machine",
          xLabel: "prompt tokens",
          yLabel: "ms",
        }),
        "handoff-tail.svg": lineChart([
          {
            name: "uncovered tail",
            points: r.rows.map((x) => ({ x: x.promptTokens, y: x.uncoveredTailMs })),
          },
          { name: "prefill", points: r.rows.map((x) => ({ x: x.promptTokens, y: x.prefillMs })) },
        ], {
          title: "Prefill time and the handoff's uncovered tail",
          xLabel: "prompt tokens",
          yLabel: "ms",
          logX: true,
        }),
      },
    };
  },
  model: async ({ quick, modelDir }) => {
    const rows = await runModelBench({
      modelDir,
      promptTokens: quick ? 1024 : 4096,
      decodeTokens: quick ? 64 : 256,
      repeats: quick ? 2 : 5,
    });
    return {
      name: "model",
      rows,
      table: table(
        ["family", "prompt", "prefill tok/s", "decode tok/s", "FFI us/call"],
        rows.map((r) => [
          r.family,
          r.promptTokens,
          r.prefillTokensPerSec,
          r.decodeTokensPerSec,
          r.ffiOverheadUs,
        ]),
      ),
      notes: [
        "Tiny random-weight models, 2 threads, flash attention off, f16 K/V; medians of repeats.",
        "FFI us/call: wall time per llama_decode call minus llama.cpp's own eval time.",
      ],
      charts: {
        "model-throughput.svg": barChart(rows.map((r) => r.family), [
          { name: "prefill tok/s", values: rows.map((r) => r.prefillTokensPerSec) },
          { name: "decode tok/s x10", values: rows.map((r) => r.decodeTokensPerSec * 10) },
        ], { title: "Local throughput per family", xLabel: "family", yLabel: "tokens/s" }),
      },
    };
  },
  state: stateBenchSection,
  prefix: prefixSection,
  batch: async ({ quick, modelDir }) => {
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
    const nodeRan = rows.some((r) => r.nodeTokensPerSec !== null);
    const label = (r: (typeof rows)[number]) => `${r.family} c=${r.concurrency}`;
    return {
      name: "batch",
      rows,
      table: table(
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
      ),
      notes: [
        "Decode throughput on one decode worker's shared context (the loop `serve --role decode` runs with --batching on), in process: tokens/s summed over streams, decode phase only (each wave's prompts prefilled first), 16 requests of 32 to 480 prompt tokens in waves of `streams`; one-at-a-time: the same requests decoded one after another on a context of their own. Medians of repeats, each batched run measured right after its one-at-a-time run; tiny random-weight models, 1 thread (a loaded 2-core machine stalls two-thread graphs at barriers).",
        "tok/CPU-s: decode tokens per CPU-second of the bench process (user + system, /proc/self/stat): on a machine shared with other work this does not depend on how much CPU the others take; wall-clock tok/s does.",
        "Exactness under batching: token agreement counts greedy tokens equal to the one-at-a-time run up to each stream's first divergence; logits bitwise is the share of logits rows equal bit for bit. Batched decode is NOT bitwise exact on this build (rows differ in the last bits, ~3e-7); a sequence decoded alone in the shared context is (serve/batch_loop_test.ts), which is where the handoff probe and --probe requests run.",
        nodeSkipped === null
          ? "node-llama-cpp 3.21.1 (installed at bench time into .cache/node-llama-cpp, not a project dependency; bench/node_llama_cpp_run.mjs under `node`) runs the same model file, the same 16 requests (token ids), 1 thread, the same per-sequence context (1,024 cells, `streams` sequences of one context, its own batching), greedy, and the same llama.cpp build (its prebuilt @node-llama-cpp/<platform>@3.21.1, which this project loads too). Decode phase only: each wave's prompts but their last token are evaluated first, then the clock runs while each sequence evaluates its last prompt token and generates (one decode more per stream than ours, which samples its first token from the prefill's logits). ours / node-llama-cpp: our batched tok/s over its tok/s, measured in the same run (node-llama-cpp first, then ours; noisy on a shared machine, see tok/CPU-s). Agreement: greedy tokens equal to our batched run's, up to each stream's first divergence."
          : `node-llama-cpp comparison skipped: ${nodeSkipped}.`,
      ],
      charts: {
        "batch-throughput.svg": barChart(rows.map(label), [
          { name: "batched", values: rows.map((r) => r.batchedTokensPerSec) },
          { name: "one at a time", values: rows.map((r) => r.sequentialTokensPerSec) },
          ...(nodeRan
            ? [{ name: "node-llama-cpp", values: rows.map((r) => r.nodeTokensPerSec ?? 0) }]
            : []),
        ], {
          title: "Decode tokens/s summed over streams, one decode worker",
          xLabel: "family, concurrent streams",
          yLabel: "tokens/s",
        }),
      },
    };
  },
};

const USAGE = `usage: deno task bench [--only ${
  Object.keys(SECTIONS).join(",")
}] [--quick] [--out DIR]
  (fuzzing: deno run -A --unstable-net bench/fuzz.ts --help)`;

function parseFlags() {
  try {
    return parseArgs({
      args: Deno.args,
      options: {
        only: { type: "string" },
        quick: { type: "boolean", default: false },
        out: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
    }).values;
  } catch (error) {
    // A bad flag is the user's mistake: say so with the usage, not a stack trace.
    console.error(`error: ${(error as Error).message}\n${USAGE}`);
    Deno.exit(2);
  }
}

async function main(): Promise<void> {
  // Placement (issue 11): `bench calibrate ...` writes the planner's calibration file.
  if (Deno.args[0] === "calibrate") return await calibrateMain(Deno.args.slice(1));
  const values = parseFlags();
  if (values.help) return console.log(USAGE);
  const names = values.only ? values.only.split(",") : Object.keys(SECTIONS);
  for (const n of names) {
    if (!SECTIONS[n]) {
      console.error(
        `error: unknown bench section "${n}" (use: ${Object.keys(SECTIONS).join(", ")})\n${USAGE}`,
      );
      Deno.exit(2);
    }
  }
  const modelDir = `${cacheDir()}/models`;
  const sections: ReportSection[] = [];
  for (const n of names) {
    console.error(`bench: ${n} ...`);
    const section = await SECTIONS[n]({ quick: values.quick, modelDir });
    console.log(`\n== ${n}\n${section.table}`);
    sections.push(section);
  }
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  const out = values.out ?? `reports/bench-${stamp}`;
  await writeReport(out, "skippy-disagg benchmarks", sections);
  console.log(`\nreport: ${out}/README.md`);
}

if (import.meta.main) await main();
