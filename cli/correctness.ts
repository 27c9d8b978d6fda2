/**
 * `correctness state-handoff`: runs the handoff parity matrix (correctness/) on the random-weight
 * test models and prints one row per case; exits non-zero unless every continuation is
 * bit-exact and every injected fault is refused.
 */
import { type Command, Option } from "commander";
import { StateValidationError, UsageError } from "../core/errors.ts";
import {
  caseContextTokens,
  type CaseResult,
  DEFAULT_PAGE_TOKENS,
  defaultPromptTokens,
  formatNotes,
  formatSummary,
  formatTable,
  type MatrixCase,
  runMatrix,
  type Variant,
  VARIANTS,
} from "../correctness/mod.ts";
import {
  ensureModelFile,
  FAMILIES,
  type Family,
  familySpec,
  type Preset,
  PRESETS,
} from "../models/mod.ts";
import type { GpuLayersRequest } from "../ffi/mod.ts";
import { registerProcessHandoff } from "./_correctness_process.ts";
import { registerChaos } from "./_correctness_chaos.ts";
import {
  DECODE_MODES,
  type DecodeMode,
  formatSpeculationRow,
  runSpeculationCase,
} from "../correctness/speculation.ts";
import { listArg, oneOf } from "./_list_args.ts";
import { gpuLayersArg, intArg } from "./_options.ts";
import { cacheDir } from "./paths.ts";
import { defaultCertificationPath, writeCertification } from "./_certify.ts"; // placement (issue 11)

interface HandoffFlags {
  families: Family[];
  promptTokens?: number[];
  pageTokens: number[];
  steps: number;
  variants: Variant[];
  preset: Preset;
  threads: number;
  flashAttn: boolean;
  gpuLayers: GpuLayersRequest;
  modelDir?: string;
  json: boolean;
  decodeModes?: DecodeMode[];
  /** Placement (issue 11): certification file to update, or true for the default one. */
  certify?: string | true;
}

export function register(program: Command): void {
  const correctness = program.command("correctness").description("correctness harnesses");
  correctness
    .command("state-handoff")
    .description(
      "prefill, hand the state to a fresh context on another model instance, continue: " +
        "bit-exact logits, and faults refused before commit",
    )
    .option("--families <list>", "model families", listArg(oneOf(FAMILIES)), [...FAMILIES])
    .option(
      "--prompt-tokens <list>",
      "prompt lengths (default: 1024,8192,32000; hybrid also 64000)",
      listArg(intArg(1, 1 << 20)),
    )
    .option(
      "--page-tokens <list>",
      "tokens per prefill chunk and KV page",
      listArg(intArg(1, 8192)),
      [...DEFAULT_PAGE_TOKENS],
    )
    .option("--steps <n>", "greedy tokens compared after the handoff", intArg(1, 4096), 16)
    .option("--variants <list>", "variants per case", listArg(oneOf(VARIANTS)), [...VARIANTS])
    .addOption(
      new Option("--preset <name>", "model preset").choices([...PRESETS]).default("tiny"),
    )
    .option("--threads <n>", "compute threads on both sides", intArg(1, 256), 2)
    .option("--flash-attn", "flash attention on both sides", false)
    .option(
      "--gpu-layers <n|all>",
      "layers offloaded to the GPU on both sides (default auto: all when there is a GPU)",
      gpuLayersArg,
      "auto" as GpuLayersRequest,
    )
    .option("--model-dir <dir>", "folder of the test models, made on first use (default: cache)")
    .option("--json", "print the results as JSON", false)
    .option(
      "--decode-modes <list>",
      "instead of the fault variants: continue after the handoff in these decode modes " +
        `(${DECODE_MODES.join(", ")}) on a self-repeating prompt, and require tokens equal to ` +
        "colocated and target-only, and MTP drafts bitwise equal (speculation: per-session contexts)",
      listArg(oneOf(DECODE_MODES)),
    )
    .option("--certify [file]", "record exact families in the certification file the planner reads")
    .action((flags: HandoffFlags) =>
      flags.decodeModes ? runDecodeModes(flags, flags.decodeModes) : runStateHandoff(flags)
    );
  registerProcessHandoff(correctness);
  registerChaos(correctness);
}

/** The cases the flags ask for; a prompt that cannot fit a family's context is a UsageError. */
export function casesFrom(flags: HandoffFlags): MatrixCase[] {
  const cases: MatrixCase[] = [];
  for (const family of flags.families) {
    const limit = familySpec(family, flags.preset).contextLength;
    for (const promptTokens of flags.promptTokens ?? defaultPromptTokens(family)) {
      for (const pageTokens of flags.pageTokens) {
        const c = { family, preset: flags.preset, promptTokens, pageTokens };
        if (caseContextTokens(c, flags.steps) > limit) {
          throw new UsageError(
            `${promptTokens} prompt tokens plus ${flags.steps} steps do not fit ${family}'s context of ${limit} tokens`,
            { hint: `use at most ${limit - flags.steps - 1} prompt tokens for ${family}` },
          );
        }
        cases.push(c);
      }
    }
  }
  return cases;
}

async function runStateHandoff(flags: HandoffFlags): Promise<void> {
  const cases = casesFrom(flags);
  const dir = flags.modelDir ?? `${cacheDir()}/models`;
  const progress = Deno.stderr.isTerminal() && !flags.json;
  const t0 = performance.now();
  const results = await runMatrix(cases, {
    steps: flags.steps,
    variants: flags.variants,
    threads: flags.threads,
    flashAttention: flags.flashAttn,
    gpuLayers: flags.gpuLayers,
    modelFor: (family, preset) => ensureModelFile(dir, { family, preset, seed: 0 }),
    digestCacheFile: `${cacheDir()}/digests.json`,
  }, (i, c) => {
    if (!progress) return;
    const line = `[${
      i + 1
    }/${cases.length}] ${c.family} ${c.promptTokens} tokens, pages of ${c.pageTokens}`;
    Deno.stderr.writeSync(new TextEncoder().encode(`\r\x1b[K${line}`));
  });
  if (progress) Deno.stderr.writeSync(new TextEncoder().encode("\r\x1b[K"));
  const wallMs = performance.now() - t0;
  if (flags.json) console.log(JSON.stringify({ steps: flags.steps, wallMs, results }, null, 2));
  else printReport(results, flags, wallMs);
  if (flags.certify) { // placement (issue 11)
    const path = flags.certify === true ? defaultCertificationPath() : flags.certify;
    const c = await writeCertification(path, results);
    console.error(
      `certification ${path}: certified ${c.certified.join(", ") || "none"}; revoked ${
        c.revoked.join(", ") || "none"
      }`,
    );
  }
  const failed = results.filter((r) => !r.ok).length;
  if (failed > 0) {
    throw new StateValidationError(
      `State handoff parity failed in ${failed} of ${results.length} cases`,
      { hint: "see the rows marked FAIL; rerun one case with --families/--prompt-tokens" },
    );
  }
}

async function runDecodeModes(flags: HandoffFlags, modes: DecodeMode[]): Promise<void> {
  const dir = flags.modelDir ?? `${cacheDir()}/models`;
  const results = [];
  for (const c of casesFrom(flags)) {
    for (const mode of modes) {
      const r = await runSpeculationCase({
        family: c.family,
        preset: c.preset,
        promptTokens: c.promptTokens,
        chunkTokens: c.pageTokens,
        mode,
      }, {
        steps: flags.steps,
        threads: flags.threads,
        modelFor: (family, preset) => ensureModelFile(dir, { family, preset, seed: 0 }),
        digestCacheFile: `${cacheDir()}/digests.json`,
      });
      results.push(r);
      if (!flags.json) console.log(formatSpeculationRow(r));
    }
  }
  if (flags.json) console.log(JSON.stringify({ steps: flags.steps, results }, null, 2));
  const failed = results.filter((r) => !r.ok).length;
  if (failed > 0) {
    throw new StateValidationError(
      `Speculative decode modes failed in ${failed} of ${results.length} cases`,
      { hint: "see the rows marked FAIL" },
    );
  }
}

function printReport(results: CaseResult[], flags: HandoffFlags, wallMs: number): void {
  console.log(
    `state handoff: ${flags.steps} greedy steps per continuation, ${flags.threads} threads, ` +
      `f16 K/V, flash attention ${flags.flashAttn ? "on" : "off"}, ISWA ring window cache`,
  );
  for (const line of formatTable(results, flags.variants)) console.log(line);
  for (const note of formatNotes(results)) console.log(`note: ${note}`);
  console.log(formatSummary(results, wallMs));
}
