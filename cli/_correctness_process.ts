/**
 * `correctness handoff`: the two-process handoff matrix (correctness/process_handoff.ts). Per
 * family, a prefill and a decode worker start as child processes on loopback; per prompt
 * length, one handoff in probe mode is compared with local generation. Prints one row per
 * case; exits non-zero unless every continuation is bit-exact and, with enough chunks, pages
 * were staged before prefill ended. The long cases (32K) live here rather than in the tests.
 */
import { type Command, Option } from "commander";
import { StateValidationError, UsageError } from "../core/errors.ts";
import {
  PROCESS_DEFAULTS,
  type ProcessCase,
  type ProcessCaseResult,
  runProcessMatrix,
} from "../correctness/mod.ts";
import {
  ensureModelFile,
  FAMILIES,
  type Family,
  familySpec,
  type Preset,
  PRESETS,
} from "../models/mod.ts";
import { CHUNK_TOKENS_MAX } from "../serve/engine.ts";
import { CHUNK_BYTES_MIN, DEFAULT_EXPORT_LIMITS } from "../serve/exporter.ts";
import { listArg, oneOf } from "./_list_args.ts";
import { intArg } from "./_options.ts";
import { cacheDir } from "./paths.ts";

interface ProcessFlags {
  families: Family[];
  promptTokens?: number[];
  chunkTokens: number;
  steps: number;
  threads: number;
  overlapChunksMin: number;
  stateChunkBytes?: number;
  hangMs: number;
  modelDir?: string;
  preset?: Preset;
  json: boolean;
}

/** Issue #4 asks for hybrid and dense at 1K and 32K; the other families run at 1K. */
export function defaultProcessPromptTokens(family: Family): number[] {
  return family === "hybrid" || family === "dense" ? [1024, 32_000] : [1024];
}

export function registerProcessHandoff(correctness: Command): void {
  correctness
    .command("handoff")
    .description(
      "two worker processes on loopback: each handoff's continuation must equal local " +
        "generation token for token, with bitwise-equal logits",
    )
    .option("--families <list>", "model families", listArg(oneOf(FAMILIES)), [...FAMILIES])
    .option(
      "--prompt-tokens <list>",
      "prompt lengths (default: 1024; hybrid and dense also 32000)",
      listArg(intArg(16, 1 << 20)),
    )
    .option(
      "--chunk-tokens <n>",
      "prompt tokens per prefill chunk and KV page",
      intArg(1, CHUNK_TOKENS_MAX),
      PROCESS_DEFAULTS.chunkTokens,
    )
    .option(
      "--steps <n>",
      "greedy tokens compared after the handoff",
      intArg(1, 4096),
      PROCESS_DEFAULTS.generateTokens,
    )
    .option(
      "--threads <n>",
      "compute threads per process",
      intArg(1, 256),
      PROCESS_DEFAULTS.threads,
    )
    .option(
      "--overlap-chunks-min <n>",
      "require pages staged before prefill ended from this many chunks on",
      intArg(2, 1 << 20),
      PROCESS_DEFAULTS.overlapChunksMin,
    )
    .option(
      "--state-chunk-bytes <n>",
      "prefill worker's largest state chunk (default: one frame, 16 MiB); small values cut " +
        "KV pages, recurrent layers and the SWA cache into many pieces",
      intArg(CHUNK_BYTES_MIN, DEFAULT_EXPORT_LIMITS.chunkBytesMax),
    )
    .option(
      "--hang-ms <ms>",
      "watchdog per handoff, for a true hang only (compute time is never bounded)",
      intArg(1_000, 86_400_000),
      PROCESS_DEFAULTS.hangMs,
    )
    .option("--model-dir <dir>", "folder of the test models, made on first use (default: cache)")
    .addOption(
      new Option("--preset <name>", "model preset (lab-state: hybrid families only)")
        .choices([...PRESETS]).default("tiny"),
    )
    .option("--json", "print the results as JSON", false)
    .action((flags: ProcessFlags) => runProcessHandoff(flags));
}

/** The cases the flags ask for; a prompt that cannot fit a family's context is a UsageError. */
export function processCasesFrom(flags: ProcessFlags): ProcessCase[] {
  const cases: ProcessCase[] = [];
  for (const family of flags.families) {
    const limit = familySpec(family, flags.preset ?? "tiny").contextLength;
    for (const promptTokens of flags.promptTokens ?? defaultProcessPromptTokens(family)) {
      if (promptTokens + flags.steps + 16 > limit) {
        throw new UsageError(
          `${promptTokens} prompt tokens plus ${flags.steps} steps do not fit ${family}'s context of ${limit} tokens`,
          { hint: `use at most ${limit - flags.steps - 16} prompt tokens for ${family}` },
        );
      }
      cases.push({ family, promptTokens });
    }
  }
  return cases;
}

async function runProcessHandoff(flags: ProcessFlags): Promise<void> {
  const cases = processCasesFrom(flags);
  const dir = flags.modelDir ?? `${cacheDir()}/models`;
  const progress = Deno.stderr.isTerminal() && !flags.json;
  const t0 = performance.now();
  const results = await runProcessMatrix(cases, {
    modelFor: (family) => ensureModelFile(dir, { family, preset: flags.preset ?? "tiny", seed: 0 }),
    chunkTokens: flags.chunkTokens,
    threads: flags.threads,
    generateTokens: flags.steps,
    hangMs: flags.hangMs,
    overlapChunksMin: flags.overlapChunksMin,
    stateChunkBytes: flags.stateChunkBytes,
  }, (i, c) => {
    if (!progress) return;
    const line = `[${i + 1}/${cases.length}] ${c.family} ${c.promptTokens} tokens`;
    Deno.stderr.writeSync(new TextEncoder().encode(`\r\x1b[K${line}`));
  });
  if (progress) Deno.stderr.writeSync(new TextEncoder().encode("\r\x1b[K"));
  const wallMs = performance.now() - t0;
  if (flags.json) console.log(JSON.stringify({ steps: flags.steps, wallMs, results }, null, 2));
  else printReport(results, flags, wallMs);
  const failed = results.filter((r) => !r.ok).length;
  if (failed > 0) {
    throw new StateValidationError(
      `Two-process handoff parity failed in ${failed} of ${results.length} cases`,
      { hint: "see the rows marked FAIL; rerun one case with --families/--prompt-tokens" },
    );
  }
}

const COLUMNS: [string, (r: ProcessCaseResult) => string][] = [
  ["family", (r) => r.family],
  ["prompt", (r) => String(r.actualPromptTokens)],
  ["chunks", (r) => String(r.chunks)],
  ["placement", (r) => r.placement],
  ["tokens", (r) => r.tokensEqual ? "equal" : "differ"],
  ["logits", (r) => r.logitsEqual ? "equal" : "differ"],
  [
    "staged early",
    (r) =>
      r.stagedEarlyFraction === null
        ? "-"
        : `${Math.round(r.stagedEarlyFraction * 100)}%${r.overlapRequired ? "" : " (n/r)"}`,
  ],
  ["chunks sent", (r) => r.chunksSent === null ? "-" : String(r.chunksSent)],
  ["largest", (r) => r.chunkBytesMaxSent === null ? "-" : `${r.chunkBytesMaxSent} B`],
  ["e2e ms", (r) => r.e2eMs.toFixed(0)],
  ["verdict", (r) => r.ok ? "pass" : "FAIL"],
];

function printReport(results: ProcessCaseResult[], flags: ProcessFlags, wallMs: number): void {
  console.log(
    `two-process handoff: ${flags.steps} greedy steps, ${flags.threads} threads per process, ` +
      `chunks of ${flags.chunkTokens} tokens; overlap required from ${flags.overlapChunksMin} chunks` +
      (flags.stateChunkBytes ? `; state chunks of at most ${flags.stateChunkBytes} bytes` : ""),
  );
  const rows = [COLUMNS.map(([h]) => h), ...results.map((r) => COLUMNS.map(([, f]) => f(r)))];
  const widths = COLUMNS.map((_, i) => Math.max(...rows.map((row) => row[i].length)));
  for (const row of rows) console.log(row.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd());
  for (const r of results) {
    if (r.detail) console.log(`FAIL ${r.family} ${r.promptTokens}: ${r.detail}`);
  }
  const passed = results.length - results.filter((r) => !r.ok).length;
  console.log(
    `${passed}/${results.length} cases pass in ${(wallMs / 1000).toFixed(1)} s` +
      (passed === results.length ? ": every continuation bit-exact" : ""),
  );
}
