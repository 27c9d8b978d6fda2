/**
 * `state inspect`: prefills synthetic tokens, exports the continuation state the way a prefill
 * worker would (a page per chunk, then the final snapshots), imports it into a second context
 * the way a decode worker would, and reports bytes by component and the export/import costs,
 * all measured from that real run. Also checks the continuation is bit-exact.
 */
import type { Command } from "commander";
import { UsageError } from "../core/errors.ts";
import { type ContextOptions, LlamaContext, LlamaModel, loadLlama } from "../ffi/mod.ts";
import { stateBackend, summarizePage } from "../ffi/state.ts";
import {
  argmax,
  type ExportedState,
  greedyLogits,
  importExported,
  type ImportResult,
  prefillAndExport,
} from "../ffi/state_driver.ts";
import { addRuntimeOptions, intArg, runtimeConfigFrom, type RuntimeFlags } from "./_options.ts";

interface InspectFlags extends RuntimeFlags {
  promptTokens: number;
  json: boolean;
  publicPath: boolean;
  swaFull: boolean;
}

/** Continuation steps compared bitwise after the import. */
const CHECK_STEPS = 4;

export function register(program: Command): void {
  const state = program.command("state").description("inspect continuation state");
  const inspect = state
    .command("inspect")
    .description("measure state bytes by component and export/import cost from a real export")
    .requiredOption("--prompt-tokens <n>", "synthetic prompt tokens to prefill", intArg(1, 1 << 22))
    .option("--json", "print one JSON object", false)
    .option(
      "--public-path",
      "use llama.cpp's public state API even when the shim is available",
      false,
    )
    .option("--no-swa-full", "ISWA models: a ring sliding-window cache (bounded final snapshot)");
  addRuntimeOptions(inspect).action((flags: InspectFlags) => runInspect(flags));
}

async function runInspect(flags: InspectFlags): Promise<void> {
  const report = await inspectState(flags);
  if (flags.json) console.log(JSON.stringify(report, null, 2));
  else console.log(formatReport(report).join("\n"));
}

export interface StateReport {
  model: string;
  path: "shim" | "public";
  fallbackReason: string | null;
  memory: string;
  promptTokens: number;
  chunkTokens: number;
  pages: number;
  bytes: {
    kvRows: number;
    kvRowsPerToken: number;
    kvMeta: number;
    conv: number;
    ssm: number;
    recurrentWhole: number;
    swa: number;
    mtpKv: number;
    mtpKvPerToken: number;
    mtpHidden: number;
    total: number;
  };
  costs: {
    prefillMs: number;
    exportUsPerPageMedian: number;
    exportUsPerPageMax: number;
    importUsPerPageMedian: number;
    importUsPerPageMax: number;
    finalExportUs: number;
    finalImportUs: number;
  };
  exact: boolean;
}

async function inspectState(flags: InspectFlags): Promise<StateReport> {
  const config = await runtimeConfigFrom(flags);
  if (flags.promptTokens + CHECK_STEPS > config.nCtx) {
    throw new UsageError(`${flags.promptTokens} prompt tokens do not fit --ctx ${config.nCtx}`, {
      hint: `use --ctx ${Math.ceil((flags.promptTokens + CHECK_STEPS) / 256) * 256}`,
    });
  }
  const lib = loadLlama({ cpuVariant: config.cpuVariant });
  using model = await LlamaModel.load(lib, config.modelPath, {
    loadMtp: config.mtp,
    gpuLayers: config.gpuLayers,
  });
  const opts: ContextOptions = {
    nCtx: config.nCtx,
    nBatch: config.chunkTokens,
    threads: config.threads,
    flashAttention: config.flashAttention,
    typeK: config.typeK,
    typeV: config.typeV,
    swaFull: flags.swaFull,
  };
  using a = await LlamaContext.create(model, opts);
  using b = await LlamaContext.create(model, opts);
  using draftA = config.mtp ? await LlamaContext.create(model, { ...opts, mtp: true }) : undefined;
  using draftB = config.mtp ? await LlamaContext.create(model, { ...opts, mtp: true }) : undefined;
  const path = flags.publicPath ? "public" : "auto";
  const backend = await stateBackend(a, path);
  const tokens = syntheticTokens(flags.promptTokens, model.vocab.nTokens);
  const exported = await prefillAndExport(a, tokens, {
    chunkTokens: config.chunkTokens,
    draft: draftA,
    path,
  });
  const imported = await importExported(b, exported, { draft: draftB, path });
  const first = argmax(a.logits());
  const local = await greedyLogits(a, first, tokens.length, CHECK_STEPS);
  const moved = await greedyLogits(b, first, tokens.length, CHECK_STEPS);
  const exact = local.every((l, k) => l.every((x, i) => Object.is(x, moved[k][i])));
  return {
    model: config.modelPath,
    path: backend.path,
    fallbackReason: backend.reason,
    memory: backend.kind,
    promptTokens: tokens.length,
    chunkTokens: config.chunkTokens,
    pages: exported.pages.length,
    bytes: componentBytes(exported),
    costs: costs(exported, imported),
    exact,
  };
}

/** Token ids 3.. spread over the vocabulary (no tokenizer, no special tokens). */
function syntheticTokens(n: number, nVocab: number): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919) % Math.max(1, nVocab - 3));
  return out;
}

function componentBytes(e: ExportedState): StateReport["bytes"] {
  const pages = e.pages.map(summarizePage);
  const mtp = e.mtpPages.map(summarizePage);
  const sum = (xs: number[]) => xs.reduce((n, x) => n + x, 0);
  const kvRows = sum(pages.map((p) => p.rowBytes));
  const mtpKv = sum(e.mtpPages.map((p) => p.byteLength));
  const r = e.recurrent;
  const bytes = {
    kvRows,
    kvRowsPerToken: kvRows / e.nTokens,
    kvMeta: sum(pages.map((p) => p.metaBytes)),
    conv: r?.layout === "split" ? r.conv.byteLength : 0,
    ssm: r?.layout === "split" ? r.ssm.byteLength : 0,
    recurrentWhole: r?.layout === "whole" ? r.blob.byteLength : 0,
    swa: e.swa?.byteLength ?? 0,
    mtpKv,
    mtpKvPerToken: sum(mtp.map((p) => p.rowBytes)) / e.nTokens,
    mtpHidden: e.mtpHidden?.byteLength ?? 0,
    total: 0,
  };
  bytes.total = bytes.kvRows + bytes.kvMeta + bytes.conv + bytes.ssm + bytes.recurrentWhole +
    bytes.swa + bytes.mtpKv + bytes.mtpHidden;
  return bytes;
}

function median(xs: number[]): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((x, y) => x - y);
  return s[Math.floor(s.length / 2)];
}

function costs(e: ExportedState, i: ImportResult): StateReport["costs"] {
  return {
    prefillMs: e.prefillMs,
    exportUsPerPageMedian: median(e.pageExportUs),
    exportUsPerPageMax: Math.max(0, ...e.pageExportUs),
    importUsPerPageMedian: median(i.pageImportUs),
    importUsPerPageMax: Math.max(0, ...i.pageImportUs),
    finalExportUs: e.finalExportUs,
    finalImportUs: i.finalImportUs,
  };
}

function formatReport(r: StateReport): string[] {
  const b = r.bytes;
  const c = r.costs;
  const n = (x: number) => Math.round(x).toLocaleString("en-US");
  const lines = [
    `model          ${r.model}`,
    `memory         ${r.memory}, state path: ${r.path}${
      r.fallbackReason ? ` (${r.fallbackReason})` : ""
    }`,
    `prompt         ${n(r.promptTokens)} tokens in ${r.pages} pages of up to ${r.chunkTokens}`,
    `kv-page        ${n(b.kvRows)} B of K/V rows (${b.kvRowsPerToken.toFixed(1)} B/token) + ${
      n(b.kvMeta)
    } B metadata`,
  ];
  if (b.conv || b.ssm) {
    lines.push(`conv / ssm     ${n(b.conv)} B / ${n(b.ssm)} B (fixed, sent once)`);
  }
  if (b.recurrentWhole) {
    lines.push(`recurrent      ${n(b.recurrentWhole)} B (one blob: layout not split)`);
  }
  if (b.swa) lines.push(`swa-kv         ${n(b.swa)} B (sent once)`);
  if (b.mtpKv) {
    lines.push(`mtp-kv         ${n(b.mtpKv)} B (${b.mtpKvPerToken.toFixed(1)} B/token of rows)`);
    lines.push(`mtp-hidden     ${n(b.mtpHidden)} B`);
  }
  lines.push(
    `total          ${n(b.total)} B`,
    `prefill        ${c.prefillMs.toFixed(1)} ms`,
    `export         ${c.exportUsPerPageMedian.toFixed(0)} us/page median, ${
      c.exportUsPerPageMax.toFixed(0)
    } max; final ${c.finalExportUs.toFixed(0)} us`,
    `import         ${c.importUsPerPageMedian.toFixed(0)} us/page median, ${
      c.importUsPerPageMax.toFixed(0)
    } max; final + commit ${c.finalImportUs.toFixed(0)} us`,
    `continuation   ${r.exact ? "bit-exact" : "DIFFERS"} over ${CHECK_STEPS} greedy tokens`,
  );
  return lines;
}
