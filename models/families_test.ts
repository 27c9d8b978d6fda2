/**
 * The families against the real llama.cpp: every family loads, tokenizes and detokenizes text
 * round trip, decodes a prompt to finite logits, and exports state of exactly the sizes
 * `expectedStateBytes()` computes from the dimensions.
 */
import assert from "node:assert/strict";
import {
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY,
  LlamaBatch,
  LlamaContext,
  type LlamaLibrary,
  LlamaModel,
  loadLlama,
} from "../ffi/mod.ts";
import { FAMILIES, type Family, makeModel, type Preset } from "./families.ts";
import { writeChunksToFile } from "./gguf_file.ts";
import { expectedStateBytes, type StateBytes } from "./state_sizes.ts";

/** Per-cell metadata in a state blob: pos (i32), n_seq_id (u32), seq_id (i32). */
const CELL_META_BYTES = 12;
/** Magic, seq id, section headers and per-layer row headers: small, but grows with layers. */
const framingBytesMax = (layers: number) => 64 + 32 * layers;
const TEXT = "Hello world, the model will prefill this text.\n\tÜnïcödé ✓ 123 <s> end";

let lib: LlamaLibrary | undefined;

async function withModel(
  family: Family,
  preset: Preset,
  fn: (model: LlamaModel) => Promise<void>,
): Promise<void> {
  lib ??= loadLlama();
  const dir = await Deno.makeTempDir({ prefix: "skippy-models-" });
  try {
    const path = `${dir}/${family}-${preset}.gguf`;
    await writeChunksToFile(path, makeModel({ family, preset, seed: 11 }).chunks);
    using model = await LlamaModel.load(lib, path, { loadMtp: family === "hybrid-moe-mtp" });
    await fn(model);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function contextFor(model: LlamaModel, nCtx: number, mtp = false): Promise<LlamaContext> {
  return LlamaContext.create(model, {
    nCtx,
    nBatch: 64,
    nUbatch: 64,
    threads: 2,
    flashAttention: false,
    typeK: "f16",
    typeV: "f16",
    mtp,
  });
}

/** Decodes `n` tokens in batches of 64 from position `pos0`; logits for the last only. */
async function decodeTokens(ctx: LlamaContext, pos0: number, n: number): Promise<Float32Array> {
  const batch = new LlamaBatch(64);
  for (let pos = pos0; pos < pos0 + n; pos += 64) {
    const count = Math.min(64, pos0 + n - pos);
    batch.clear();
    for (let i = 0; i < count; i++) {
      batch.add(259 + ((pos + i) * 7) % 600, pos + i, i === count - 1);
    }
    await ctx.decode(batch);
  }
  return ctx.logits(-1);
}

function assertFiniteAndVaried(logits: Float32Array): void {
  assert.ok(logits.every(Number.isFinite), "logits must be finite");
  const min = Math.min(...logits);
  const max = Math.max(...logits);
  assert.ok(max - min > 0.1, `logits should vary (range ${min}..${max})`);
}

/** Checks blob sizes against the computed ones at two prompt lengths. */
async function checkStateSizes(ctx: LlamaContext, s: StateBytes): Promise<void> {
  const before = ctx.stateSeqSize(0);
  await decodeTokens(ctx, 320, 128);
  const growth = (ctx.stateSeqSize(0) - before) / 128;
  assert.equal(growth, s.layers.attention > 0 ? s.kvBytesPerToken + CELL_META_BYTES : 0);
  const partial = ctx.stateSeqSize(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const framing = framingBytesMax(s.layers.recurrent + s.layers.slidingWindow);
  if (s.layers.recurrent > 0) {
    const extra = partial - s.recurrentBytes;
    assert.ok(extra >= 0 && extra < framing, `recurrent part ${partial}`);
  }
  if (s.layers.slidingWindow > 0) {
    const extra = partial - s.slidingWindow * (s.swaKvBytesPerToken + CELL_META_BYTES);
    assert.ok(extra >= 0 && extra < framing, `swa part ${partial}`);
  }
}

for (const family of FAMILIES) {
  Deno.test(`the tiny ${family} model loads, round-trips text and decodes to finite logits`, async () => {
    await withModel(family, "tiny", async (model) => {
      const made = makeModel({ family, preset: "tiny", seed: 11 });
      const info = model.info();
      assert.equal(info.architecture, made.spec.architecture);
      assert.equal(info.nLayer, made.spec.layers.length);
      assert.equal(info.nLayerNextn, made.spec.nextnLayers);
      assert.equal(info.nEmbd, made.spec.nEmbd);
      assert.equal(info.nVocab, made.spec.nVocab);
      assert.equal(info.nCtxTrain, made.spec.contextLength);
      assert.equal(info.nSwa, made.spec.attention?.slidingWindow ?? 0);
      const tokens = model.vocab.tokenize(TEXT, false);
      assert.ok(tokens.length < TEXT.length, "common words should merge into pieces");
      assert.equal(model.vocab.detokenize(tokens, false), TEXT);
      using ctx = await contextFor(model, made.spec.contextLength);
      assertFiniteAndVaried(await decodeTokens(ctx, 0, 320));
      await checkStateSizes(ctx, expectedStateBytes(made.spec, "f16"));
    });
  });
}

for (const family of ["hybrid", "hybrid-moe-mtp"] as const) {
  Deno.test(`the super-mini ${family} model loads and exports the state sizes it promises`, async () => {
    await withModel(family, "super-mini", async (model) => {
      const spec = makeModel({ family, preset: "super-mini" }).spec;
      using ctx = await contextFor(model, 4096);
      assertFiniteAndVaried(await decodeTokens(ctx, 0, 320));
      await checkStateSizes(ctx, expectedStateBytes(spec, "f16"));
    });
  });
}

Deno.test("the MTP draft context of hybrid-moe-mtp keeps mtpKvBytesPerToken per token", async () => {
  await withModel("hybrid-moe-mtp", "tiny", async (model) => {
    const spec = makeModel({ family: "hybrid-moe-mtp", preset: "tiny" }).spec;
    const s = expectedStateBytes(spec, "f16");
    using target = await contextFor(model, 4096);
    using draft = await contextFor(model, 4096, true);
    target.setEmbeddingsNextn(true, false);
    draft.setEmbeddingsNextn(true, true);
    const tokens = model.vocab.tokenize("the model will draft the next token", true);
    const batch = new LlamaBatch(64);
    tokens.forEach((t, i) => batch.add(t, i, true));
    await target.decode(batch);
    // Draft catch-up: row k carries the target's nextn hidden row of token k - 1.
    const draftBatch = new LlamaBatch(64, spec.nEmbd);
    tokens.forEach((t, i) => {
      const h = i === 0 ? new Float32Array(spec.nEmbd) : target.nextnEmbedding(i - 1);
      draftBatch.add(t, i, i === tokens.length - 1, 0, h);
    });
    await draft.decode(draftBatch);
    assertFiniteAndVaried(draft.logits(-1));
    const perToken = s.mtpKvBytesPerToken + CELL_META_BYTES;
    const framing = draft.stateSeqSize(0) - tokens.length * perToken;
    assert.ok(framing > 0 && framing < framingBytesMax(1), `draft framing ${framing}`);
  });
});
