/**
 * The recurrent snapshot in layer runs (schema 2): windows exported through the shim equal the
 * bytes of llama.cpp's own whole snapshot, and runs imported one by one (header first, the
 * rest in any order) leave the decoder byte-identical to the prefiller and continuing
 * bitwise-exactly. Real llama.cpp, tiny hybrid and recurrent test models.
 */
import assert from "node:assert/strict";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";
import { loadLlama } from "./library.ts";
import { loadShim } from "./shim/shim.ts";
import { bits, HandoffPair, prompt, TEST_CONTEXT } from "./_state_testing.ts";
import { argmax, greedyLogits, prefillAndExport } from "./state_driver.ts";
import { LlamaContext } from "./context.ts";
import { Verifier } from "./verify.ts";
import { StagedImport } from "./staged_import.ts";
import { entrySpans, exportRecurrentWindow, recurrentLayout, splitRecurrent } from "./state.ts";

const N = 700;
const CHUNK = 256;
const shimOk = (await loadShim(loadLlama())).ok;

/** Runs of `size` recurrent layers: [r0, r1) pairs covering [0, count). */
function runs(count: number, size: number): [number, number][] {
  const out: [number, number][] = [];
  for (let r = 0; r < count; r += size) out.push([r, Math.min(count, r + size)]);
  return out;
}

for (const family of ["hybrid", "recurrent"]) {
  Deno.test({
    name:
      `${family}: snapshot windows equal the whole snapshot, and runs imported in any order continue exactly`,
    ignore: !shimOk,
    fn: async () => {
      using pair = await HandoffPair.open(family);
      const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
      const whole = await pair.a.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
      const layout = await recurrentLayout(pair.a);
      assert.ok(layout, "the shim gives a layout");
      assert.equal(layout.bytes, whole.byteLength);
      assert.equal(layout.conv.length, layout.ssm.length);
      const window = (from: number, to: number) => exportRecurrentWindow(pair.a, from, to);
      // Every entry, and the header, is exactly llama.cpp's bytes.
      assert.deepEqual(
        await window(0, layout.conv[0].start),
        whole.subarray(0, layout.conv[0].start),
      );
      for (const e of [...layout.conv, ...layout.ssm]) {
        assert.deepEqual(await window(e.start, e.end), whole.subarray(e.start, e.end));
      }
      const R = layout.conv.length;
      const imp = await StagedImport.open(pair.b, { nTokens: N });
      for (const page of state.pages) await imp.addPage(page);
      // Header run first; then the rest shuffled (ssm before conv too).
      const conv = runs(R, 2).map(([a, b]) => ["conv", a, b] as const);
      const ssm = runs(R, 3).map(([a, b]) => ["ssm", a, b] as const);
      const rest = [...ssm.reverse(), ...conv.slice(1).reverse()];
      for (const [part, a, b] of [conv[0], ...rest]) {
        const list = layout[part];
        const from = part === "conv" && a === 0 ? 0 : list[a].start;
        await imp.addRecurrentLayers(part, a, b, await window(from, list[b - 1].end));
      }
      await imp.commit();
      assert.deepEqual(await pair.b.stateSeqGet(0, 0), await pair.a.stateSeqGet(0, 0));
      const first = 7;
      const want = await greedyLogits(pair.a, first, N, 4);
      const got = await greedyLogits(pair.b, first, N, 4);
      for (let k = 0; k < want.length; k++) {
        assert.deepEqual(bits(got[k]), bits(want[k]), `step ${k}`);
      }
    },
  });
}

Deno.test({
  name: "recurrent runs are refused before the header, at the wrong size, twice, or incomplete",
  ignore: !shimOk,
  fn: async () => {
    using pair = await HandoffPair.open("hybrid");
    const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
    const layout = (await recurrentLayout(pair.a))!;
    const window = (from: number, to: number) => exportRecurrentWindow(pair.a, from, to);
    const imp = await StagedImport.open(pair.b, { nTokens: N });
    for (const page of state.pages) await imp.addPage(page);
    const ssm0 = await window(layout.ssm[0].start, layout.ssm[0].end);
    await assert.rejects(imp.addRecurrentLayers("ssm", 0, 1, ssm0), /header .* must come first/);
    await imp.addRecurrentLayers("conv", 0, 1, await window(0, layout.conv[0].end));
    await assert.rejects(
      imp.addRecurrentLayers("ssm", 0, 2, ssm0),
      /ssm of recurrent layers \[0, 2\): a run of \d+ bytes, this model keeps \d+/,
    );
    await imp.addRecurrentLayers("ssm", 0, 1, ssm0);
    await assert.rejects(imp.addRecurrentLayers("ssm", 0, 1, ssm0), /staged twice/);
    // Everything but the remaining layers: the commit names the missing bytes.
    await assert.rejects(imp.commit(), /conv\/ssm snapshot bytes \[\d+, \d+\) missing/);
    assert.equal(imp.state, "staging");
    await imp.abort();
    assert.equal(pair.b.seqPosMax(0), -1);
  },
});

Deno.test("[public] recurrent runs are held and joined into llama.cpp's own import, exactly", async () => {
  using pair = await HandoffPair.open("hybrid");
  const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
  const whole = await pair.a.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const split = splitRecurrent(whole);
  assert.equal(split.layout, "split");
  if (split.layout !== "split") return;
  const spans = entrySpans(split);
  const base = split.conv.byteLength;
  const R = spans.conv.length;
  const imp = await StagedImport.open(pair.b, { nTokens: N, path: "public" });
  for (const page of state.pages) await imp.addPage(page);
  const ssmRuns = runs(R, 2).reverse();
  for (const [a, b] of ssmRuns) {
    await imp.addRecurrentLayers(
      "ssm",
      a,
      b,
      whole.subarray(spans.ssm[a].start + base, spans.ssm[b - 1].end + base),
    );
  }
  await imp.addRecurrentLayers("conv", 0, R, split.conv);
  await imp.commit();
  assert.deepEqual(await pair.b.stateSeqGet(0, 0), await pair.a.stateSeqGet(0, 0));
});

Deno.test({
  name:
    "a decoder keeping rollback snapshots (n_rs_seq 4) imports runs windowed, as the whole import does",
  ignore: !shimOk,
  fn: async () => {
    // B keeps speculation's rollback snapshots; C is the same context importing whole (public).
    using pair = await HandoffPair.open("hybrid", {}, { nRsSeq: 4 });
    const c = await LlamaContext.create(pair.models[1], { ...TEST_CONTEXT, nRsSeq: 4 });
    try {
      assert.equal(pair.b.model.lib.symbols.llama_n_rs_seq(pair.b.ptr), 4, "snapshots kept");
      const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
      const layout = (await recurrentLayout(pair.a))!;
      const window = (from: number, to: number) => exportRecurrentWindow(pair.a, from, to);
      const R = layout.conv.length;
      const windowed = await StagedImport.open(pair.b, { nTokens: N });
      const whole = await StagedImport.open(c, { nTokens: N, path: "public" });
      for (const page of state.pages) {
        await windowed.addPage(page);
        await whole.addPage(page);
      }
      for (const [part, a, b] of [["conv", 0, R], ["ssm", 0, R]] as const) {
        const list = layout[part];
        const from = part === "conv" ? 0 : list[a].start;
        const bytes = await window(from, list[b - 1].end);
        await windowed.addRecurrentLayers(part, a, b, bytes);
        await whole.addRecurrentLayers(part, a, b, bytes);
      }
      assert.equal((await recurrentLayout(pair.b))?.bytes, layout.bytes, "written into B already");
      await windowed.commit();
      await whole.commit();
      const full = (ctx: LlamaContext) => ctx.stateSeqGet(0, 0);
      assert.deepEqual(await full(pair.b), await full(pair.a));
      assert.deepEqual(await full(c), await full(pair.a));
      // A verify of three rows, two of them rolled back through the snapshots, then two greedy
      // steps: bitwise the same on the windowed and the whole import.
      const first = 7;
      const after = async (ctx: LlamaContext) => {
        const v = new Verifier(ctx, 4);
        assert.equal(v.kind, "native");
        const rows = await v.verify([first, 11, 13], N);
        await v.keep(1);
        const next = argmax(rows.logits[0]);
        return [rows.logits[0], ...await greedyLogits(ctx, next, N + 1, 2)].map(bits);
      };
      assert.deepEqual(await after(pair.b), await after(c));
    } finally {
      c.free();
    }
  },
});
