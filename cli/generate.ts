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

interface GenerateFlags extends RuntimeFlags, RequestFlags {
  json: boolean;
  probe: boolean;
}

export function register(program: Command): void {
  const cmd = program
    .command("generate")
    .description("generate text locally (colocated prefill and decode)")
    .option("--json", "print one JSON object with text, tokens, numerics and timings", false)
    .option("--probe", "with --json: add a SHA-256 of every step's logits", false);
  addRuntimeOptions(addRequestOptions(cmd)).action((flags: GenerateFlags) => runGenerate(flags));
}

async function runGenerate(flags: GenerateFlags): Promise<void> {
  const prompt = await readPrompt(flags);
  const config = await runtimeConfigFrom(flags);
  const t0 = performance.now();
  using engine = await Engine.open(config);
  const loadMs = performance.now() - t0;
  const promptTokens = engine.model.vocab.tokenize(prompt);
  const t1 = performance.now();
  const logits = await engine.prefill(promptTokens);
  const prefillMs = performance.now() - t1;
  const sampling = { temperature: flags.temperature, topK: flags.topK, topP: flags.topP };
  const sampler = { seed: flags.seed, draws: 0 };
  const decoder = new PieceDecoder(engine.model.vocab);
  const tokens: number[] = [];
  const logitDigests: string[] = [];
  const out = new TextEncoder();
  const t2 = performance.now();
  for await (const step of engine.generate(logits, flags.n, sampling, sampler)) {
    tokens.push(step.token);
    if (flags.probe) logitDigests.push(await logitsDigest(step.logits));
    const piece = decoder.push(step.token);
    if (!flags.json && piece) await Deno.stdout.write(out.encode(piece));
  }
  const decodeMs = performance.now() - t2;
  const tail = decoder.flush();
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
  };
  console.log(JSON.stringify(result, null, 2));
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}
