import assert from "node:assert/strict";
import { StateValidationError } from "../core/errors.ts";
import { bits, prompt, TEST_CONTEXT } from "./_state_testing.ts";
import { testModel } from "../testing/models.ts";
import { LlamaBatch } from "./batch.ts";
import { type ContextOptions, LlamaContext } from "./context.ts";
import { type CapturedLayer, LayerCapture } from "./layer_capture.ts";
import { loadLlama } from "./library.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";
import { LlamaModel } from "./model.ts";
import { loadShim } from "./shim/shim.ts";
import { exportKvPage } from "./state.ts";

const lib = loadLlama();
const shim = await loadShim(lib);

/** A test that needs the shim; skipped, saying why, when it could not be built or loaded. */
function captureTest(name: string, fn: () => Promise<void>) {
  Deno.test({
    name: name + (shim.ok ? "" : ` (skipped: ${shim.reason})`),
    ignore: !shim.ok,
    fn,
  });
}

// Last chunk of 256 tokens in ubatches of 128: the capture must skip the first ubatch.
const CONTEXT: ContextOptions = { ...TEST_CONTEXT, nBatch: 256, nUbatch: 128 };
const CHUNK = 256;

async function withContext(
  family: string,
  fn: (ctx: LlamaContext) => Promise<void>,
  over: Partial<ContextOptions> = {},
) {
  using model = await LlamaModel.load(lib, await testModel(family), {});
  using ctx = await LlamaContext.create(model, { ...CONTEXT, ...over });
  await fn(ctx);
}

/** Prefills all chunks but the last; returns the last chunk's batch and its final position. */
async function prefillButLast(ctx: LlamaContext, tokens: Int32Array) {
  const batch = new LlamaBatch(CHUNK);
  const last = Math.floor((tokens.length - 1) / CHUNK) * CHUNK;
  for (let p0 = 0; p0 < last; p0 += CHUNK) {
    batch.fill(tokens.subarray(p0, p0 + CHUNK), p0);
    await ctx.decode(batch);
  }
  batch.fill(tokens.subarray(last), last);
  return { batch, finalPos: tokens.length - 1 };
}

/**
 * Prefills all but the last chunk of `tokens`, then decodes it with the capture and the last
 * page (from the last chunk's start, at most `pageBytesMax`) armed.
 */
async function decodeWithPage(
  ctx: LlamaContext,
  capture: LayerCapture,
  tokens: Int32Array,
  pageBytesMax: number,
) {
  const { batch, finalPos } = await prefillButLast(ctx, tokens);
  const p0 = Math.floor(finalPos / CHUNK) * CHUNK;
  await capture.arm(0, finalPos);
  await capture.armPage(p0, pageBytesMax);
  const done = ctx.decode(batch);
  const got: CapturedLayer[] = [];
  for await (const layer of capture.layers(done)) got.push(layer);
  await done;
  return { got, finalPos, p0, page: capture.page() };
}

async function openCapture(ctx: LlamaContext): Promise<LayerCapture> {
  const opened = await LayerCapture.open(ctx);
  assert.ok(opened.ok, opened.ok ? "" : opened.reason);
  return opened.capture;
}

/** The conv and SSM entries of a PARTIAL_ONLY snapshot (offsets from its known layout). */
function snapshotEntries(blob: Uint8Array, layers: number, convEntry: number, ssmEntry: number) {
  const head = 28;
  assert.equal(blob.byteLength, head + layers * (convEntry + ssmEntry));
  const conv = (k: number) => blob.subarray(head + k * convEntry, head + (k + 1) * convEntry);
  const at = head + layers * convEntry;
  const ssm = (k: number) => blob.subarray(at + k * ssmEntry, at + (k + 1) * ssmEntry);
  return { conv, ssm };
}

for (const family of ["hybrid", "recurrent"]) {
  captureTest(
    `${family}: the layers captured during the last ubatch equal the PARTIAL_ONLY snapshot byte for byte`,
    () =>
      withContext(family, async (ctx) => {
        using capture = await openCapture(ctx);
        const { batch, finalPos } = await prefillButLast(ctx, prompt(700));
        await capture.arm(0, finalPos);
        const done = ctx.decode(batch);
        const got: CapturedLayer[] = [];
        for await (const layer of capture.layers(done)) got.push(layer);
        await done;
        await capture.disarm();

        assert.equal(got.length, capture.nLayers);
        assert.deepEqual(got.map((l) => l.index), [...Array(capture.nLayers).keys()]);
        assert.ok(got.every((l, i) => i === 0 || l.layer > got[i - 1].layer), "trunk order");
        // Each final-state write was observed once, in the last ubatch only.
        assert.equal(capture.stats().observed, 2 * capture.nLayers);

        const blob = await ctx.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        const e = snapshotEntries(
          blob,
          capture.nLayers,
          got[0].conv.byteLength,
          got[0].ssm.byteLength,
        );
        for (const l of got) {
          assert.deepEqual(l.conv, e.conv(l.index), `conv of layer ${l.layer}`);
          assert.deepEqual(l.ssm, e.ssm(l.index), `ssm of layer ${l.layer}`);
        }
        assert.deepEqual(capture.snapshot(), blob);
      }),
  );
}

captureTest(
  "hybrid: the last page exported when the last attention layer has written equals the page exported after the decode",
  () =>
    withContext("hybrid", async (ctx) => {
      using capture = await openCapture(ctx);
      const { got, finalPos, p0, page } = await decodeWithPage(ctx, capture, prompt(700), 1 << 24);
      await capture.disarm();

      assert.equal(page.state, "ready");
      if (page.state !== "ready") return;
      assert.deepEqual(page.bytes, await exportKvPage(ctx, p0, finalPos + 1));
      // K and V of the last attention layer, and each recurrent layer's two writes.
      assert.equal(capture.stats().observed, 2 * capture.nLayers + 2);
      // Exported in graph order: after every recurrent layer before the last attention layer,
      // before every one after it.
      assert.ok(capture.pageLayer > 0);
      for (const l of got) {
        const before = l.layer < capture.pageLayer;
        assert.ok(before ? l.readyNs <= page.readyNs : l.readyNs >= page.readyNs, `${l.layer}`);
      }
    }),
);

captureTest(
  "a last page larger than armed is not exported, and says why; the layers still are",
  () =>
    withContext("hybrid", async (ctx) => {
      using capture = await openCapture(ctx);
      const { got, page } = await decodeWithPage(ctx, capture, prompt(300), 1024);
      assert.equal(page.state, "failed");
      assert.match(
        page.state === "failed" ? page.reason : "",
        /needs \d+ bytes, more than the 1024/,
      );
      assert.equal(got.length, capture.nLayers);
      await capture.disarm();
      await assert.rejects(capture.armPage(256, 1 << 24), /arm the capture first/);
    }),
);

captureTest("arming the capture changes neither the logits nor the state", async () => {
  const tokens = prompt(600, 3);
  const run = (armed: boolean) =>
    withContext("hybrid", async (ctx) => {
      using capture = await openCapture(ctx);
      const { batch, finalPos } = await prefillButLast(ctx, tokens);
      if (armed) await capture.arm(0, finalPos);
      if (armed) await capture.armPage(Math.floor(finalPos / CHUNK) * CHUNK, 1 << 24);
      const done = ctx.decode(batch);
      if (armed) { for await (const _ of capture.layers(done)); }
      await done;
      await capture.disarm();
      const observed = capture.stats().observed;
      const logits = bits(ctx.logits());
      // One more token after the disarm: nothing is observed any more.
      batch.fill([logits[0] % 900 + 3], finalPos + 1);
      await ctx.decode(batch);
      assert.equal(capture.stats().observed, observed);
      results.push({ logits, next: bits(ctx.logits()), state: await ctx.stateSeqGet(0) });
    });
  const results: { logits: Uint8Array; next: Uint8Array; state: Uint8Array }[] = [];
  await run(false);
  await run(true);
  assert.deepEqual(results[1].logits, results[0].logits);
  assert.deepEqual(results[1].next, results[0].next);
  assert.deepEqual(results[1].state, results[0].state);
});

captureTest(
  "a capture armed for a position the decode does not reach fails loudly",
  () =>
    withContext("hybrid", async (ctx) => {
      using capture = await openCapture(ctx);
      const { batch, finalPos } = await prefillButLast(ctx, prompt(300));
      await capture.arm(0, finalPos + 1);
      const done = ctx.decode(batch);
      await assert.rejects(
        async () => {
          for await (const _ of capture.layers(done));
        },
        (e) => e instanceof StateValidationError && /got 0 of \d+ recurrent layers/.test(e.message),
      );
      assert.equal(capture.stats().observed, 0);
      assert.throws(() => capture.snapshot(), StateValidationError);
    }),
);

captureTest("the capture is refused, with a reason, where it cannot work", async () => {
  await withContext("dense", async (ctx) => {
    const opened = await LayerCapture.open(ctx);
    assert.equal(opened.ok, false);
    assert.match(opened.ok ? "" : opened.reason, /has no recurrent state/);
  });
  await withContext("hybrid", async (ctx) => {
    const opened = await LayerCapture.open(ctx);
    assert.equal(opened.ok, false);
    assert.match(opened.ok ? "" : opened.reason, /rollback snapshots \(n_rs_seq = 2\)/);
  }, { nRsSeq: 2 });
  await withContext("hybrid", async (ctx) => {
    using first = await openCapture(ctx);
    const second = await LayerCapture.open(ctx);
    assert.match(second.ok ? "" : second.reason, /already has a layer capture/);
    first.close();
    using third = await openCapture(ctx); // closing removed the callback
    assert.ok(third.nLayers > 0);
  });
});

captureTest("freeing the context closes a capture still open on it", async () => {
  using model = await LlamaModel.load(lib, await testModel("hybrid"), {});
  const ctx = await LlamaContext.create(model, CONTEXT);
  const capture = await openCapture(ctx);
  assert.ok(capture.stats().observed >= 0, "open before the free");
  ctx.free();
  // Left open, the shim would still count the freed address as a context with a capture and
  // refuse one on a later context allocated there.
  assert.throws(() => capture.stats(), /layer capture used after close/);
  capture.close(); // idempotent, and no longer touches the freed context
  using next = await LlamaContext.create(model, CONTEXT);
  using reopened = await openCapture(next);
  assert.ok(reopened.nLayers > 0);
});
