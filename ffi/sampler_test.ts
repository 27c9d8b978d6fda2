import assert from "node:assert/strict";
import { argmax } from "../core/sampling.ts";
import { testModel, testTokens } from "../testing/models.ts";
import { LlamaBatch, LlamaContext, LlamaModel, LlamaSampler, loadLlama } from "./mod.ts";

Deno.test("llama.cpp's greedy sampler picks the same tokens as the TypeScript sampler", async () => {
  const lib = loadLlama();
  using model = await LlamaModel.load(lib, await testModel("hybrid"));
  using ctx = await LlamaContext.create(model, {
    nCtx: 1024,
    nBatch: 512,
    threads: 2,
    flashAttention: false,
    typeK: "f16",
    typeV: "f16",
  });
  using sampler = LlamaSampler.create(lib, { temperature: 0 });
  const batch = new LlamaBatch(512);
  batch.fill(testTokens(200), 0);
  await ctx.decode(batch);
  const picked: number[] = [];
  for (let pos = 200; pos < 216; pos++) {
    const ours = argmax(ctx.logits(-1));
    const theirs = sampler.sample(ctx, -1);
    assert.equal(theirs, ours);
    picked.push(ours);
    batch.fill([ours], pos);
    await ctx.decode(batch);
  }
  assert.ok(new Set(picked).size > 1);
});

Deno.test("a seeded llama.cpp sampler chain draws reproducibly", async () => {
  const lib = loadLlama();
  using model = await LlamaModel.load(lib, await testModel("dense"));
  using ctx = await LlamaContext.create(model, {
    nCtx: 512,
    nBatch: 512,
    threads: 2,
    flashAttention: false,
    typeK: "f16",
    typeV: "f16",
  });
  const batch = new LlamaBatch(512);
  batch.fill(testTokens(64), 0);
  await ctx.decode(batch);
  const draw = (seed: number) => {
    using s = LlamaSampler.create(lib, { temperature: 1.5, topK: 50, topP: 0.95, seed });
    return Array.from({ length: 20 }, () => s.sample(ctx, -1));
  };
  assert.deepEqual(draw(7), draw(7));
  assert.notDeepEqual(draw(7), draw(8));
});
