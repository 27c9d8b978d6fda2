import assert from "node:assert/strict";
import { testModel, testTokens } from "../testing/models.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { argmax } from "../core/sampling.ts";
import { LlamaModel, loadLlama } from "./mod.ts";
import { recurrentSnapshots, rollbackKind, Verifier } from "./verify.ts";

const K = 4;
/** Largest logit difference that rounding between batch shapes explains (measured ~1e-6). */
const ROUNDING_TOLERANCE = 1e-3;

function bytesOf(f: Float32Array): Uint8Array {
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
}

async function open(model: LlamaModel, nRsSeq: number): Promise<Engine> {
  return await Engine.open(
    { ...RUNTIME_DEFAULTS, modelPath: model.path, nCtx: 1024, nRsSeq },
    model,
  );
}

/** Prefill, then `n` single-token greedy steps; every step's logits as bytes. */
async function greedy(engine: Engine, prompt: Int32Array, n: number) {
  let logits = await engine.prefill(prompt);
  const tokens: number[] = [];
  const rows: Uint8Array[] = [bytesOf(logits).slice()];
  for (let i = 0; i < n; i++) {
    tokens.push(argmax(logits));
    logits = await engine.step(tokens.at(-1)!);
    rows.push(bytesOf(logits).slice());
  }
  return { tokens, rows };
}

for (const family of ["hybrid", "hybrid-moe-mtp"]) {
  Deno.test(`${family}: n_rs_seq is kept and does not change logits (bitwise)`, async () => {
    using model = await LlamaModel.load(loadLlama(), await testModel(family));
    const prompt = testTokens(200, 950, 5);
    using plain = await open(model, 0);
    using snap = await open(model, K);
    assert.equal(recurrentSnapshots(plain.ctx), 0);
    assert.equal(recurrentSnapshots(snap.ctx), K, "llama.cpp kept n_rs_seq for this family");
    assert.equal(rollbackKind(snap.ctx, K), "native");
    const a = await greedy(plain, prompt, 12);
    const b = await greedy(snap, prompt, 12);
    assert.deepEqual(a.tokens, b.tokens);
    assert.deepEqual(a.rows, b.rows, "n_rs_seq changed logits");
  });
}

Deno.test("recurrent (mamba2): n_rs_seq is forced to 0, so rollback uses checkpoints", async () => {
  using model = await LlamaModel.load(loadLlama(), await testModel("recurrent"));
  using engine = await open(model, K);
  assert.equal(recurrentSnapshots(engine.ctx), 0);
  assert.equal(rollbackKind(engine.ctx, K), "checkpoint");
});

for (const family of ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"]) {
  Deno.test(`${family}: a rejected verify tail rolls back to the never-drafted state`, async () => {
    using model = await LlamaModel.load(loadLlama(), await testModel(family));
    const prompt = testTokens(120, 950, 9);
    using ref = await open(model, 0);
    const want = await greedy(ref, prompt, 10);
    using engine = await open(model, K);
    const verifier = new Verifier(engine.ctx, K);
    let logits = await engine.prefill(prompt);
    const got: number[] = [];
    // Each round: the committed token, then K drafts of which only `good` are right.
    for (let round = 0; got.length < 10; round++) {
      const t = argmax(logits);
      const pos = engine.position;
      const good = round % (K + 1);
      const future = want.tokens.slice(got.length + 1, got.length + 1 + K);
      const drafts = future.map((x, i) => i < good ? x : (x + 1) % 900 + 3);
      const rows = await verifier.verify([t, ...drafts], pos);
      let a = 0;
      while (a < drafts.length && argmax(rows.logits[a]) === drafts[a]) a++;
      assert.ok(a >= Math.min(good, drafts.length), `round ${round}: right drafts accepted`);
      got.push(t, ...drafts.slice(0, a));
      const replayed = await verifier.keep(a + 1);
      engine.adoptPosition(pos + a + 1);
      assert.equal(engine.ctx.seqPosMax(0), pos + a, "memory ends at the last kept position");
      logits = replayed ?? rows.logits[a];
    }
    assert.deepEqual(got.slice(0, 10), want.tokens);
    // The state after rollback continues as the reference does. Not bit for bit: positions
    // decoded in a k+1-row verify batch round differently from single-token decodes (the
    // matmul kernels differ by batch size), so the next logits agree to rounding only; a
    // wrong rollback (stale recurrent rows, a leftover draft in the KV) is far off.
    const n = got.length;
    using ref2 = await open(model, 0);
    const full = await greedy(ref2, prompt, n + 1);
    const next = await engine.step(argmax(logits));
    assert.equal(argmax(logits), full.tokens[n]);
    const expected = new Float32Array(full.rows[n + 1].slice().buffer);
    let diff = 0;
    for (let i = 0; i < expected.length; i++) {
      diff = Math.max(diff, Math.abs(expected[i] - next[i]));
    }
    console.log(`${family}: max |logit difference| after rollback: ${diff.toExponential(2)}`);
    assert.ok(diff < ROUNDING_TOLERANCE, `logits differ by ${diff} after rollback`);
  });
}
