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

Deno.test("prefix restore (iswa): the checkpoint carries the SWA window of its position, past the ring's wrap", async () => {
  // The tiny iswa model's window is 128 tokens and its SWA cache holds window + ubatch (640)
  // cells (padded), so at P = 1024 the ring has wrapped: the snapshot must hold exactly the cells the
  // cold run holds there, and continuing from it must give the cold run's logits bitwise.
  const config = {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("iswa"),
    nCtx: 1536,
    chunkTokens: 64,
  };
  const model = await LlamaModel.load(loadLlama({}), config.modelPath, {});
  try {
    const prompt = testTokens(1300);
    const P = 1024;
    using cold = await Engine.open(config, model);
    await cold.prefill(prompt.subarray(0, P));
    const checkpoint = await cold.ctx.stateSeqGet(0);
    const swaAtP = await cold.ctx.stateSeqGet(0, PARTIAL_ONLY);
    const coldLogits = bytes(await cold.prefill(prompt.subarray(P)));
    const coldSwaEnd = await cold.ctx.stateSeqGet(0, PARTIAL_ONLY);

    using warm = await Engine.open(config, model);
    await warm.ctx.stateSeqSet(checkpoint, 0);
    warm.adoptPosition(P);
    assert.equal(warm.ctx.seqPosMax(0), P - 1);
    assert.deepEqual(await warm.ctx.stateSeqGet(0, PARTIAL_ONLY), swaAtP);
    assert.deepEqual(bytes(await warm.prefill(prompt.subarray(P))), coldLogits);
    assert.deepEqual(await warm.ctx.stateSeqGet(0, PARTIAL_ONLY), coldSwaEnd);

    // The global KV of [0, P) with the SWA window another prompt has at P: not the cold run.
    using other = await Engine.open(config, model);
    await other.prefill(testTokens(P, 950, 7));
    const otherSwa = await other.ctx.stateSeqGet(0, PARTIAL_ONLY);
    assert.notDeepEqual(otherSwa, swaAtP);
    using mismatched = await Engine.open(config, model);
    await mismatched.ctx.stateSeqSet(checkpoint, 0);
    await mismatched.ctx.stateSeqSet(otherSwa, 0, PARTIAL_ONLY);
    mismatched.adoptPosition(P);
    assert.notDeepEqual(bytes(await mismatched.prefill(prompt.subarray(P))), coldLogits);
  } finally {
    model.free();
  }
});
