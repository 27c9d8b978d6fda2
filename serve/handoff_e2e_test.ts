/**
 * Two worker processes on loopback, real llama.cpp, real QUIC: a handoff's continuation equals
 * local generation token for token, with bitwise-equal logits (SHA-256 per step in probe mode).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { testModel } from "../testing/models.ts";
import { runHandoff } from "./coordinator.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { startLocalCluster } from "./local_cluster.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";

const CTX = 32_768;
/**
 * Compute threads per process. Two workers and this test share two cores; they rarely compute
 * at the same time (the decoder only imports while the prefiller computes). Both sides use the
 * same count: it is part of the numerical identity.
 */
const THREADS = 2;
const SAMPLING = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };

const SENTENCE = "the quick brown fox jumps over the lazy dog and ";

/** A prompt of about `tokens` tokens for the model's tokenizer. */
async function promptOf(model: string, tokens: number): Promise<string> {
  using m = await LlamaModel.load(loadLlama(), model);
  const perSentence = m.vocab.tokenize(SENTENCE.repeat(100), false).length / 100;
  return SENTENCE.repeat(Math.floor((tokens - 2) / perSentence));
}

async function localRun(model: string, prompt: string, n: number) {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: model,
    nCtx: CTX,
    threads: THREADS,
  });
  const tokens = engine.model.vocab.tokenize(prompt);
  const first = await engine.prefill(tokens);
  const out = { tokens: [] as number[], digests: [] as string[], promptTokens: tokens.length };
  for await (const s of engine.generate(first, n, { temperature: 0 }, { seed: 1, draws: 0 })) {
    out.tokens.push(s.token);
    out.digests.push(
      createHash("sha256").update(
        new Uint8Array(s.logits.buffer, s.logits.byteOffset, s.logits.byteLength),
      ).digest("hex"),
    );
  }
  return out;
}

/** Issue #4 asks for hybrid and dense at 1K and 32K; the other families run at 1K. */
const CASES: [string, number[]][] = [
  ["hybrid", [1024, 32_000]],
  ["dense", [1024, 32_000]],
  ["hybrid-moe-mtp", [1024]],
  ["iswa", [1024]],
  ["recurrent", [1024]],
];

for (const [family, sizes] of CASES) {
  Deno.test(`${family}: a handoff between two processes continues exactly like local generation`, async (t) => {
    const model = await testModel(family);
    const cluster = await startLocalCluster({
      args: ["--model", model, "--ctx", String(CTX), "--threads", String(THREADS)],
    });
    try {
      for (const size of sizes) {
        await t.step(`${size} prompt tokens`, async () => {
          const prompt = await promptOf(model, size);
          const result = await runHandoff(cluster.client, {
            prefill: cluster.prefill.peer,
            decode: cluster.decode.peer,
            prompt,
            generateTokens: 12,
            sampling: SAMPLING,
            tenantId: "test",
            probe: true,
            timeoutMs: 120_000,
          });
          const local = await localRun(model, prompt, 12);
          assert.equal(result.placement, "disaggregated");
          assert.equal(result.promptTokens, local.promptTokens);
          assert.ok(result.promptTokens >= size * 0.9 && result.promptTokens <= size);
          assert.deepEqual(result.tokens, local.tokens);
          assert.deepEqual(result.logitsSha256, local.digests);
          // Early pages reached the decoder (it granted credit back) before prefill ended.
          const staged = result.telemetry.stagedBeforePrefillEndFraction;
          if (size > 1024) assert.ok(staged !== null && staged > 0, `staged early: ${staged}`);
        });
      }
    } finally {
      await cluster.stop();
    }
  });
}
