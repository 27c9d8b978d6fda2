import assert from "node:assert/strict";
import { testModel, testTokens } from "../testing/models.ts";
import { Engine, RUNTIME_DEFAULTS, type RuntimeConfig } from "./engine.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";

async function config(family: string, over: Partial<RuntimeConfig> = {}): Promise<RuntimeConfig> {
  return { ...RUNTIME_DEFAULTS, modelPath: await testModel(family), nCtx: 2048, ...over };
}

function bytesOf(f: Float32Array): Uint8Array {
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
}

async function greedyRun(engine: Engine, prompt: Int32Array, n: number) {
  const tokens: number[] = [];
  const logits: Uint8Array[] = [];
  const first = await engine.prefill(prompt);
  for await (const step of engine.generate(first, n, { temperature: 0 }, { seed: 0, draws: 0 })) {
    tokens.push(step.token);
    logits.push(bytesOf(step.logits).slice());
  }
  return { tokens, logits };
}

for (const family of ["dense", "hybrid"]) {
  Deno.test(`${family}: the same model and prompt give the same tokens and bitwise logits twice`, async () => {
    const prompt = testTokens(300);
    const runs = [];
    for (let i = 0; i < 2; i++) {
      using engine = await Engine.open(await config(family));
      runs.push(await greedyRun(engine, prompt, 16));
    }
    assert.deepEqual(runs[0].tokens, runs[1].tokens);
    assert.deepEqual(runs[0].logits, runs[1].logits);
    // Not a degenerate model: the greedy continuation is not one repeated token.
    assert.ok(new Set(runs[0].tokens).size > 1);
  });
}

for (const family of ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"]) {
  Deno.test(`${family}: chunked prefill gives the same logits as one-shot prefill`, async () => {
    const prompt = testTokens(1000, 950, 3);
    using shared = await LlamaModel.load(loadLlama(), await testModel(family));
    const results = [];
    // 1000 tokens in one decode call vs chunks of 256 and of 100, same micro-batch size.
    for (const chunkTokens of [1000, 256, 100]) {
      // A window-sized ISWA ring places cells by batch, so chunking is part of its numerics;
      // the full-size cache is not (see UBATCH_TOKENS and the identity's swaFull field).
      const swaFull = family === "iswa";
      using engine = await Engine.open(await config(family, { chunkTokens, swaFull }), shared);
      results.push(await greedyRun(engine, prompt, 4));
    }
    for (const r of results.slice(1)) {
      assert.deepEqual(r.tokens, results[0].tokens);
      assert.deepEqual(r.logits, results[0].logits);
    }
  });
}

Deno.test("with flash attention, thread count changes decode logits (numerical identity)", async () => {
  // Flash attention splits the KV for single-token decode over >= 512 cells by thread count.
  const prompt = testTokens(700);
  const runs = [];
  for (const threads of [1, 2]) {
    using engine = await Engine.open(await config("dense", { threads, flashAttention: true }));
    runs.push(await greedyRun(engine, prompt, 8));
  }
  assert.notDeepEqual(runs[0].logits, runs[1].logits);
});
