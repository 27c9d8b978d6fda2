/**
 * `generate`: colocated local generation, the baseline every disaggregated run is compared
 * with. Streams text to stdout, or prints one JSON object with `--json`.
 */
import { logitsDigest } from "../serve/probe.ts";
import type { Command } from "commander";
import { Engine } from "../serve/engine.ts";
import { PieceDecoder } from "../ffi/mod.ts";
import {
  addRequestOptions,
  addRuntimeOptions,
  readPrompt,
  type RequestFlags,
  runtimeConfigFrom,
  type RuntimeFlags,
} from "./_options.ts";
import { numericsReport } from "./_report.ts";
import {
  addSpeculationOptions,
  speculationConfigFrom,
  type SpeculationFlags,
} from "./_speculation.ts";
import { usesMtp } from "../core/speculation.ts";
import { MtpDraft } from "../ffi/mtp.ts";
import { readGgufFile, specFromGguf } from "../models/mod.ts";
import { prefillWithDraft, runColocated, type SpeculationReport } from "../serve/speculative.ts";

interface GenerateFlags extends RuntimeFlags, RequestFlags, SpeculationFlags {
  json: boolean;
  probe: boolean;
}

export function register(program: Command): void {
  const cmd = program
    .command("generate")
    .description("generate text locally (colocated prefill and decode)")
    .option("--json", "print one JSON object with text, tokens, numerics and timings", false)
    .option("--probe", "with --json: add a SHA-256 of every step's logits", false);
  addSpeculationOptions(addRuntimeOptions(addRequestOptions(cmd))).action((flags: GenerateFlags) =>
    runGenerate(flags)
  );
}

async function runGenerate(flags: GenerateFlags): Promise<void> {
  const prompt = await readPrompt(flags);
  const speculation = speculationConfigFrom(flags);
  const speculating = speculation.mode !== "none";
  const config = { ...await runtimeConfigFrom(flags), ...(speculating ? { speculation } : {}) };
  if (usesMtp(speculation.mode) && config.mtp === undefined) {
    // As the workers do: MTP layers load when the model has them (unless --no-mtp).
    config.mtp = specFromGguf(await readGgufFile(config.modelPath), config.modelPath)
      .nextnLayers > 0;
  }
  const t0 = performance.now();
  using engine = await Engine.open(config);
  // MTP speculation drafts from the model's MTP head, in a draft context beside the target.
  using draft = usesMtp(speculation.mode) && engine.model.loadMtp &&
      engine.model.info().nLayerNextn > 0
    ? await MtpDraft.open(engine.ctx)
    : null;
  const loadMs = performance.now() - t0;
  const promptTokens = engine.model.vocab.tokenize(prompt);
  const t1 = performance.now();
  const logits = speculating
    ? await prefillWithDraft(engine, draft, promptTokens)
    : await engine.prefill(promptTokens);
  const prefillMs = performance.now() - t1;
  const sampling = { temperature: flags.temperature, topK: flags.topK, topP: flags.topP };
  const sampler = { seed: flags.seed, draws: 0 };
  const run = speculating
    ? runColocated(engine, draft, promptTokens, logits, flags.n, sampling, sampler, speculation)
    : null;
  const decoder = new PieceDecoder(engine.model.vocab);
  const tokens: number[] = [];
  const logitDigests: string[] = [];
  const out = new TextEncoder();
  const t2 = performance.now();
  const steps = run?.steps ?? engine.generate(logits, flags.n, sampling, sampler);
  for await (const step of steps) {
    tokens.push(step.token);
    if (flags.probe) logitDigests.push(await logitsDigest(step.logits));
    const piece = decoder.push(step.token);
    if (!flags.json && piece) await Deno.stdout.write(out.encode(piece));
  }
  const decodeMs = performance.now() - t2;
  const tail = decoder.flush();
  const fallback = run?.report()?.fallback ?? null;
  if (fallback !== null) console.error(`speculation: fallback (${fallback})`);
  if (!flags.json) {
    await Deno.stdout.write(out.encode(tail + "\n"));
    return;
  }
  const text = engine.model.vocab.detokenize(Int32Array.from(tokens));
  const result = {
    text,
    tokens,
    promptTokens: promptTokens.length,
    numerics: numericsReport(engine),
    sampling: { ...sampling, seed: flags.seed },
    timings: {
      loadMs: round(loadMs),
      prefillMs: round(prefillMs),
      prefillTokensPerSec: round(promptTokens.length / (prefillMs / 1000)),
      decodeMs: round(decodeMs),
      decodeTokensPerSec: tokens.length > 1 ? round((tokens.length - 1) / (decodeMs / 1000)) : 0,
    },
    ...(flags.probe ? { logitsSha256: logitDigests } : {}),
    speculation: run ? speculationJson(speculation.mode, run.report()) : { mode: "none" },
  };
  console.log(JSON.stringify(result, null, 2));
}

/** The run's speculation report for `--json` (counts only; `fallback` names any fallback). */
function speculationJson(mode: string, report: SpeculationReport | null) {
  if (report === null) return { mode, fallback: null, rounds: 0 }; // ended at the first token
  const { counters, ...rest } = report;
  return { ...rest, ...counters };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}
