/**
 * What a prefix-cache checkpoint of a hybrid model restores (serve/prefix_cache.ts), on the
 * real tiny hybrid model: the whole-sequence snapshot at P carries the recurrent state of
 * exactly P (byte-equal to the cold run's there), and continuing from it gives the cold run's
 * logits bitwise. The negative control: the same KV with the recurrent state another prompt
 * has at P (what a KV-only reuse amounts to) gives different logits, so the bitwise checks of
 * the cache's tests would catch such a mismatch.
 */
import assert from "node:assert/strict";
import { testModel, testTokens } from "../testing/models.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { LlamaModel, loadLlama, MtpDraft } from "../ffi/mod.ts";
import { PrefixCache } from "./prefix_cache.ts";

/** `llama_state_seq_flags`: the recurrent (partial) part only. */
const PARTIAL_ONLY = 1;
const bytes = (f: Float32Array) => new Uint8Array(f.buffer, f.byteOffset, f.byteLength).slice();

Deno.test("prefix restore (hybrid): the checkpoint's recurrent state is its position's; KV alone is caught", async () => {
  const config = {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("hybrid"),
    nCtx: 1024,
    chunkTokens: 64,
  };
  const lib = loadLlama({});
  const model = await LlamaModel.load(lib, config.modelPath, {});
  try {
    const prompt = testTokens(200);
    const P = 128;
    using cold = await Engine.open(config, model);
    await cold.prefill(prompt.subarray(0, 96));
    await cold.prefill(prompt.subarray(96, P));
    const checkpoint = await cold.ctx.stateSeqGet(0);
    const recurrentAtP = await cold.ctx.stateSeqGet(0, PARTIAL_ONLY);
    const coldLogits = bytes(await cold.prefill(prompt.subarray(P)));

    using warm = await Engine.open(config, model);
    await warm.ctx.stateSeqSet(checkpoint, 0);
    warm.adoptPosition(P);
    assert.equal(warm.ctx.seqPosMax(0), P - 1);
    assert.deepEqual(await warm.ctx.stateSeqGet(0, PARTIAL_ONLY), recurrentAtP);
    assert.deepEqual(bytes(await warm.prefill(prompt.subarray(P))), coldLogits);

    // KV of [0, P) with the recurrent state another prompt has at P (what reusing the KV alone
    // amounts to): not the cold run.
    using other = await Engine.open(config, model);
    await other.prefill(testTokens(P, 950, 7));
    const otherRecurrent = await other.ctx.stateSeqGet(0, PARTIAL_ONLY);
    using mismatched = await Engine.open(config, model);
    await mismatched.ctx.stateSeqSet(checkpoint, 0);
    await mismatched.ctx.stateSeqSet(otherRecurrent, 0, PARTIAL_ONLY);
    mismatched.adoptPosition(P);
    assert.notDeepEqual(bytes(await mismatched.prefill(prompt.subarray(P))), coldLogits);
  } finally {
    model.free();
  }
});

Deno.test("prefix restore (hybrid-moe-mtp): a hit restores the draft's KV and hidden row exactly", async () => {
  const config = {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("hybrid-moe-mtp"),
    nCtx: 1024,
    chunkTokens: 64,
    mtp: true,
  };
  const cache = new PrefixCache(
    { prefixCacheBytesMax: 64 * 1024 * 1024, prefixBlockTokens: 32, prefixCheckpointsMax: 2 },
    "hybrid-moe-mtp",
  );
  const prompt = testTokens(150);
  /** Prefills as the exporter does: the draft catches up after each chunk; stops at checkpoints. */
  const run = async (engine: Engine, draft: MtpDraft) => {
    const plan = await cache.prepare("t", prompt, engine, draft);
    const onChunk = ({ p0, p1 }: { p0: number; p1: number }) =>
      draft.catchUp(prompt.subarray(p0, p1), p0);
    let from = plan.restoredTokens;
    for (const b of plan.checkpoints) {
      await engine.prefill(prompt.subarray(from, b), onChunk);
      await plan.onCheckpoint(b);
      from = b;
    }
    const logits = bytes(await engine.prefill(prompt.subarray(from), onChunk));
    const draftState = await draft.ctx.stateSeqGet(0);
    return { restored: plan.restoredTokens, logits, draftState, pending: draft.pending.slice() };
  };
  using coldEngine = await Engine.open(config);
  using coldDraft = await MtpDraft.open(coldEngine.ctx);
  const cold = await run(coldEngine, coldDraft);
  assert.equal(cold.restored, 0);
  using warmEngine = await Engine.open(config, coldEngine.model);
  using warmDraft = await MtpDraft.open(warmEngine.ctx);
  const warm = await run(warmEngine, warmDraft);
  assert.equal(warm.restored, 128);
  assert.deepEqual(warm.logits, cold.logits);
  assert.deepEqual(warm.draftState, cold.draftState);
  assert.deepEqual(warm.pending, cold.pending);
  cache.clear();
});

Deno.test("prefix restore (iswa): the ring restores at its cells' own indices, exact after it wraps", async () => {
  // The tiny iswa model's window is 128 tokens and its ring holds window + ubatch cells, so a
  // continuation from 640 to 1024 wraps it. An earlier prompt sharing 768 tokens leaves a
  // checkpoint at 640; the warm run restores it through the cache and must equal the cold run.
  const config = {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("iswa"),
    nCtx: 1280,
    chunkTokens: 256,
  };
  const cache = new PrefixCache(
    { prefixCacheBytesMax: 256 * 1024 * 1024, prefixBlockTokens: 128, prefixCheckpointsMax: 4 },
    "iswa",
  );
  const prompt = testTokens(1024);
  const earlier = testTokens(1024, 950, 5);
  earlier.set(prompt.subarray(0, 768));
  /** Prefills as the exporter does: stopping at the plan's checkpoints. */
  const run = async (engine: Engine, tokens: Int32Array) => {
    const plan = await cache.prepare("t", tokens, engine, null);
    let from = plan.restoredTokens;
    for (const b of plan.checkpoints) {
      await engine.prefill(tokens.subarray(from, b));
      await plan.onCheckpoint(b);
      from = b;
    }
    return {
      restored: plan.restoredTokens,
      logits: bytes(await engine.prefill(tokens.subarray(from))),
    };
  };
  const model = await LlamaModel.load(loadLlama({}), config.modelPath, {});
  try {
    using cold = await Engine.open(config, model);
    const coldLogits = bytes(await cold.prefill(prompt));
    const coldRing = await cold.ctx.stateSeqGet(0, PARTIAL_ONLY);
    {
      using first = await Engine.open(config, model);
      assert.equal((await run(first, earlier)).restored, 0);
    }
    using warm = await Engine.open(config, model);
    const hit = await run(warm, prompt);
    assert.equal(hit.restored, 640);
    assert.deepEqual(hit.logits, coldLogits);
    assert.deepEqual(await warm.ctx.stateSeqGet(0, PARTIAL_ONLY), coldRing);

    // Why not llama.cpp's own state: restored with `llama_state_seq_set_data`, the same
    // position's state continues differently once the ring wraps.
    using mid = await Engine.open(config, model);
    await mid.prefill(prompt.subarray(0, 640));
    const seqState = await mid.ctx.stateSeqGet(0);
    using plain = await Engine.open(config, model);
    await plain.ctx.stateSeqSet(seqState, 0);
    plain.adoptPosition(640);
    assert.notDeepEqual(bytes(await plain.prefill(prompt.subarray(640))), coldLogits);
  } finally {
    cache.clear();
    model.free();
  }
});
