/**
 * State export/import cost against context length: what a prefill worker pays per page while
 * it streams, and what lands on the handoff's uncovered tail.
 *
 * For each context length L: prefill L tokens, then time (medians of repeats)
 * - export of the last page of P tokens (P = 256 and 2048): into a fresh buffer, and into a
 *   reused one (the native copy alone); must stay flat in L on the shim path;
 * - import (append) of that page into a decoder holding the other L - P positions;
 * - the public fallback's page export (a full sequence export, sliced), O(L);
 * - the final recurrent snapshot export and import, and the public fallback's tail: assembling
 *   and importing every page at once.
 *
 * Standalone: `deno run -A bench/state_bench.ts [--quick] [--family hybrid] [--preset tiny]
 * [--contexts 1024,8192,32768]`.
 */
import { parseArgs } from "node:util";
import { cacheDir } from "../cli/paths.ts";
import { ensureModelFile } from "../models/mod.ts";
import {
  type ContextOptions,
  LlamaBatch,
  LlamaContext,
  LlamaModel,
  loadLlama,
} from "../ffi/mod.ts";
import { exportKvPage, exportRecurrent, stateBackend } from "../ffi/state.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "../ffi/llama.ts";
import { joinRecurrent } from "../ffi/state.ts";
import { median, repeat, table } from "./stats.ts";
import type { ReportSection } from "./report.ts";
import { lineChart } from "./svg.ts";

export interface StateBenchOptions {
  modelDir: string;
  family?: string;
  preset?: string;
  contexts?: readonly number[];
  pageTokens?: readonly number[];
  repeats?: number;
}

export interface PageCostRow {
  path: "shim" | "public";
  contextTokens: number;
  pageTokens: number;
  pageBytes: number;
  exportUs: number;
  exportIntoUs: number;
  importUs: number;
}

export interface TailRow {
  contextTokens: number;
  recurrentBytes: number;
  recurrentExportMs: number;
  recurrentImportMs: number;
  publicAssembleImportMs: number;
}

export interface StateBenchResult {
  family: string;
  preset: string;
  path: "shim" | "public";
  fallbackReason: string | null;
  pages: PageCostRow[];
  tail: TailRow[];
}

const BENCH_CONTEXT: Omit<ContextOptions, "nCtx"> = {
  nBatch: 2048,
  threads: 2,
  flashAttention: false,
  typeK: "f16",
  typeV: "f16",
};

function tokens(n: number, salt: number): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919 + salt) % 900);
  return out;
}

async function prefill(ctx: LlamaContext, prompt: Int32Array): Promise<void> {
  const batch = new LlamaBatch(BENCH_CONTEXT.nBatch);
  for (let p = 0; p < prompt.length; p += BENCH_CONTEXT.nBatch) {
    batch.fill(prompt.subarray(p, p + BENCH_CONTEXT.nBatch), p, false);
    await ctx.decode(batch);
  }
}

const us = async (fn: () => Promise<unknown>) => {
  const t0 = performance.now();
  await fn();
  return (performance.now() - t0) * 1000;
};

/** Page export/import costs at one context length, on one path. */
async function pageCosts(
  a: LlamaContext,
  b: LlamaContext,
  L: number,
  P: number,
  path: "auto" | "public",
  repeats: number,
): Promise<PageCostRow> {
  const backend = await stateBackend(a, path);
  const page = await exportKvPage(a, L - P, L, { path });
  const into = new Uint8Array(page.byteLength);
  const exportUs = median(
    await repeat(repeats, () => us(() => exportKvPage(a, L - P, L, { path })), 1),
  );
  const exportIntoUs = backend.path === "shim"
    ? median(await repeat(repeats, () => us(() => exportKvPage(a, L - P, L, { into })), 1))
    : NaN;
  let importUs = NaN;
  if (backend.shim) {
    const shim = backend.shim;
    b.clearMemory();
    for (let p = 0; p < L - P; p += 2048) {
      const q = Math.min(L - P, p + 2048);
      await shim.importPage(b, "main", 0, await exportKvPage(a, p, q));
    }
    importUs = median(
      await repeat(repeats, async () => {
        const t = await us(() => shim.importPage(b, "main", 0, page));
        b.seqRm(0, L - P, L);
        return t;
      }, 1),
    );
  }
  return {
    path: backend.path,
    contextTokens: L,
    pageTokens: P,
    pageBytes: page.byteLength,
    exportUs,
    exportIntoUs,
    importUs,
  };
}

/** The fixed-size tail: recurrent snapshot, and the public path's one assembled import. */
async function tailCosts(
  a: LlamaContext,
  b: LlamaContext,
  L: number,
  repeats: number,
): Promise<TailRow> {
  const kind = (await stateBackend(a, "public")).kind;
  const row: TailRow = {
    contextTokens: L,
    recurrentBytes: 0,
    recurrentExportMs: NaN,
    recurrentImportMs: NaN,
    publicAssembleImportMs: NaN,
  };
  if (kind === "hybrid" || kind === "recurrent") {
    const snap = await exportRecurrent(a);
    const blob = joinRecurrent(snap);
    row.recurrentBytes = blob.byteLength;
    row.recurrentExportMs = median(await repeat(repeats, () => us(() => exportRecurrent(a)), 1)) /
      1000;
    row.recurrentImportMs = median(
      await repeat(
        repeats,
        () => us(() => b.stateSeqSet(blob, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)),
        1,
      ),
    ) / 1000;
  }
  if (kind === "hybrid" || kind === "kv") {
    const pages: Uint8Array[] = [];
    for (let p = 0; p < L; p += 2048) pages.push(await exportKvPage(a, p, Math.min(L, p + 2048)));
    const snap = kind === "hybrid" ? await exportRecurrent(a) : null;
    const runs = await repeat(Math.min(3, repeats), async () => {
      b.clearMemory();
      const imp = await StagedImport.open(b, { nTokens: L, path: "public" });
      for (const page of pages) await imp.addPage(page);
      if (snap) await imp.setRecurrent(snap);
      const t = await us(() => imp.validate());
      await imp.abort();
      return t;
    });
    row.publicAssembleImportMs = median(runs) / 1000;
  }
  return row;
}

/** Runs the state benchmark; returns its rows (never asserted anywhere). */
export async function runStateBench(o: StateBenchOptions): Promise<StateBenchResult> {
  const family = o.family ?? "hybrid";
  const preset = o.preset ?? "tiny";
  const lib = loadLlama();
  using model = await LlamaModel.load(
    lib,
    await ensureModelFile(o.modelDir, { family, preset, seed: 1 }),
  );
  const contexts = o.contexts ?? [1024, 2048, 4096, 8192, 16384, 32768];
  const repeats = o.repeats ?? 9;
  const result: StateBenchResult = {
    family,
    preset,
    path: "public",
    fallbackReason: null,
    pages: [],
    tail: [],
  };
  for (const L of contexts) {
    using a = await LlamaContext.create(model, { ...BENCH_CONTEXT, nCtx: L });
    using b = await LlamaContext.create(model, { ...BENCH_CONTEXT, nCtx: L });
    const backend = await stateBackend(a);
    result.path = backend.path;
    result.fallbackReason = backend.reason;
    await prefill(a, tokens(L, L));
    for (const P of o.pageTokens ?? [256, 2048]) {
      if (P > L) continue;
      if (backend.path === "shim") result.pages.push(await pageCosts(a, b, L, P, "auto", repeats));
      result.pages.push(await pageCosts(a, b, L, P, "public", Math.min(repeats, 5)));
    }
    b.clearMemory();
    result.tail.push(await tailCosts(a, b, L, repeats));
  }
  return result;
}

/** The result as plain-text tables. */
export function formatStateBench(r: StateBenchResult): string {
  const f = (x: number) => Number.isNaN(x) ? "-" : x;
  const pages = table(
    ["path", "context", "page tok", "page B", "export us", "export into us", "import us"],
    r.pages.map((
      p,
    ) => [
      p.path,
      p.contextTokens,
      p.pageTokens,
      p.pageBytes,
      f(p.exportUs),
      f(p.exportIntoUs),
      f(p.importUs),
    ]),
  );
  const tail = table(
    ["context", "recurrent B", "rec export ms", "rec import ms", "public assemble+import ms"],
    r.tail.map((
      t,
    ) => [
      t.contextTokens,
      t.recurrentBytes,
      f(t.recurrentExportMs),
      f(t.recurrentImportMs),
      f(t.publicAssembleImportMs),
    ]),
  );
  const why = r.fallbackReason ? ` (public only: ${r.fallbackReason})` : "";
  return `${r.family} ${r.preset}, state path ${r.path}${why}\n\n${pages}\n\n${tail}`;
}

/** The `state` section of `deno task bench`: tables, notes and the flatness chart. */
export async function stateBenchSection(
  o: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const r = await runStateBench({
    modelDir: o.modelDir,
    contexts: o.quick ? [1024, 4096, 8192] : undefined,
    repeats: o.quick ? 5 : 9,
  });
  const series = (path: string, P: number, key: "exportIntoUs" | "importUs" | "exportUs") => ({
    name: `${path} ${key === "importUs" ? "import" : "export"} ${P}`,
    points: r.pages.filter((p) => p.path === path && p.pageTokens === P && !Number.isNaN(p[key]))
      .map((p) => ({ x: p.contextTokens, y: p[key] })),
  });
  return {
    name: "state",
    rows: r,
    table: formatStateBench(r),
    notes: [
      "Medians of repeats; tiny hybrid model (2 attention layers, 512 B of f16 K/V per token), 2 threads, flash attention off.",
      "export into: the native copy and checksum into a reused buffer; export: into a fresh buffer (adds allocation).",
      "import: append of the last page into a decoder holding the rest; public: the fallback's sliced full export.",
    ],
    charts: {
      "state-page-cost.svg": lineChart([
        series("shim", 256, "exportIntoUs"),
        series("shim", 2048, "exportIntoUs"),
        series("shim", 256, "importUs"),
        series("shim", 2048, "importUs"),
        series("public", 2048, "exportUs"),
      ], {
        title: "Page cost vs context length",
        xLabel: "context tokens",
        yLabel: "us per page",
        logX: true,
      }),
    },
  };
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      quick: { type: "boolean", default: false },
      family: { type: "string", default: "hybrid" },
      preset: { type: "string", default: "tiny" },
      contexts: { type: "string" },
    },
  });
  const contexts = values.contexts?.split(",").map(Number);
  const result = await runStateBench({
    modelDir: `${cacheDir()}/models`,
    family: values.family,
    preset: values.preset,
    contexts: contexts ?? (values.quick ? [1024, 4096, 8192] : undefined),
    repeats: values.quick ? 5 : 9,
  });
  console.log(formatStateBench(result));
}
