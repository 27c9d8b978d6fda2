/**
 * `deno task bench [--only model,state,transport,handoff] [--quick] [--out DIR]`
 *
 * Runs the benchmark sections, prints their tables and writes a report folder with SVG charts
 * (default `reports/bench-<timestamp>`). Benchmarks are never asserted in the test suite.
 */
import { parseArgs } from "node:util";
import { cacheDir } from "../cli/_paths.ts";
import { barChart } from "./svg.ts";
import { type ReportSection, writeReport } from "./report.ts";
import { table } from "./stats.ts";
import { runModelBench } from "./model_bench.ts";
import { stateBenchSection } from "./state_bench.ts";

type Section = (o: { quick: boolean; modelDir: string }) => Promise<ReportSection>;

const SECTIONS: Record<string, Section> = {
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
};

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      only: { type: "string" },
      quick: { type: "boolean", default: false },
      out: { type: "string" },
    },
  });
  const names = values.only ? values.only.split(",") : Object.keys(SECTIONS);
  for (const n of names) {
    if (!SECTIONS[n]) {
      console.error(`error: unknown bench section "${n}" (use: ${Object.keys(SECTIONS).join(", ")})`);
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
