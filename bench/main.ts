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
import { handoffSection } from "./handoff_bench.ts";
import { payloadSection } from "./lab_tail_bench.ts";
import { labTailSection } from "./lab_tail_report.ts";
import { speculationSection } from "./speculation_bench.ts";
import { linkSection } from "./link_report.ts";
import { calibrateMain } from "./calibrate.ts";
import { batchSection } from "./batch_report.ts";
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
  handoff: (o) => handoffSection(o),
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
  batch: (o) => batchSection(o),
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
