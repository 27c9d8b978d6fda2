/**
 * One recurrent layer larger than a chunk (schema 3): its run leaves in byte pieces, each
 * exported as its own window, and the decoder writes each piece into the layer's tensor rows
 * as it arrives (header piece first, the rest in any order). The decoder's state ends up
 * byte-identical to the prefiller's and continues bitwise-exactly; a piece of the wrong run
 * size, a piece staged twice, or a missing piece is refused. Real llama.cpp, the tiny hybrid
 * test model, with pieces far smaller than one layer (3,456 B conv, 16,384 B SSM).
 */
import assert from "node:assert/strict";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";
import { loadLlama } from "./library.ts";
import { loadShim } from "./shim/shim.ts";
import { bits, HandoffPair, prompt } from "./_state_testing.ts";
import { greedyLogits, prefillAndExport } from "./state_driver.ts";
import { StagedImport } from "./staged_import.ts";
import { entrySpans, exportRecurrentWindow, recurrentLayout, splitRecurrent } from "./state.ts";

const N = 300;
const CHUNK = 128;
/** Piece size: every conv and SSM layer of the tiny models is cut into several. */
const PIECE = 1000;
const shimOk = (await loadShim(loadLlama())).ok;

interface Piece {
  part: "conv" | "ssm";
  r: number;
  /** Snapshot bytes [from, to) of this piece. */
  from: number;
  to: number;
  offset: number;
  of: number;
}

/** One-layer runs of both parts, each cut into pieces of `PIECE`; the header piece first. */
function piecesOf(layout: { conv: { start: number; end: number }[]; ssm: typeof layout.conv }) {
  const out: Piece[] = [];
  for (const part of ["conv", "ssm"] as const) {
    layout[part].forEach((e, r) => {
      const start = part === "conv" && r === 0 ? 0 : e.start;
      const of = e.end - start;
      for (let offset = 0; offset < of; offset += PIECE) {
        const size = Math.min(PIECE, of - offset);
        out.push({ part, r, from: start + offset, to: start + offset + size, offset, of });
      }
    });
  }
  return out;
}

/** A fixed shuffle (no randomness in tests): every third piece from the back, then the rest. */
function shuffled<T>(xs: T[]): T[] {
  const back = xs.filter((_, i) => i % 3 === 0).reverse();
  return [...back, ...xs.filter((_, i) => i % 3 !== 0)];
}

Deno.test({
  name: "hybrid: one layer in byte pieces, imported in any order, continues exactly",
  ignore: !shimOk,
  fn: async () => {
    using pair = await HandoffPair.open("hybrid");
    const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
    const layout = (await recurrentLayout(pair.a))!;
    const pieces = piecesOf(layout);
    assert.ok(pieces.length > 4 * layout.conv.length, "layers are cut into several pieces");
    const imp = await StagedImport.open(pair.b, { nTokens: N });
    for (const page of state.pages) await imp.addPage(page);
    for (const p of [pieces[0], ...shuffled(pieces.slice(1))]) {
      const bytes = await exportRecurrentWindow(pair.a, p.from, p.to);
      assert.equal(bytes.byteLength, p.to - p.from);
      await imp.addRecurrentLayers(p.part, p.r, p.r + 1, bytes, p);
    }
    await imp.commit();
    assert.deepEqual(await pair.b.stateSeqGet(0, 0), await pair.a.stateSeqGet(0, 0));
    const want = await greedyLogits(pair.a, 7, N, 4);
    const got = await greedyLogits(pair.b, 7, N, 4);
    for (let k = 0; k < want.length; k++) {
      assert.deepEqual(bits(got[k]), bits(want[k]), `step ${k}`);
    }
  },
});

Deno.test({
  name: "pieces are refused at the wrong run size, twice, or missing at commit",
  ignore: !shimOk,
  fn: async () => {
    using pair = await HandoffPair.open("hybrid");
    const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
    const layout = (await recurrentLayout(pair.a))!;
    const pieces = piecesOf(layout);
    const window = (p: Piece) => exportRecurrentWindow(pair.a, p.from, p.to);
    const imp = await StagedImport.open(pair.b, { nTokens: N });
    for (const page of state.pages) await imp.addPage(page);
    const ssm = pieces.filter((p) => p.part === "ssm" && p.r === 1);
    await assert.rejects(
      imp.addRecurrentLayers("ssm", 1, 2, await window(ssm[1]), ssm[1]),
      /header .* must come first/,
    );
    await imp.addRecurrentLayers("conv", 0, 1, await window(pieces[0]), pieces[0]);
    const bytes = await window(ssm[1]);
    await assert.rejects(
      imp.addRecurrentLayers("ssm", 1, 2, bytes, { offset: ssm[1].offset, of: ssm[1].of + 4 }),
      /ssm of recurrent layers \[1, 2\) bytes \[1000, 2000\): a run of \d+ bytes, this model keeps \d+/,
    );
    await assert.rejects(
      imp.addRecurrentLayers("ssm", 1, 2, bytes, { offset: ssm[1].of - 10, of: ssm[1].of }),
      /not within a run of/,
    );
    await imp.addRecurrentLayers("ssm", 1, 2, bytes, ssm[1]);
    await assert.rejects(imp.addRecurrentLayers("ssm", 1, 2, bytes, ssm[1]), /staged twice/);
    // Overlapping by one byte is staged twice too.
    const shifted = { offset: ssm[1].offset + 1, of: ssm[1].of };
    await assert.rejects(
      imp.addRecurrentLayers("ssm", 1, 2, bytes.subarray(1), shifted),
      /staged twice/,
    );
    for (const p of pieces.slice(1)) {
      if (p.part === "ssm" && p.r === 1 && p.offset <= PIECE) continue; // [0, 1000) stays out
      await imp.addRecurrentLayers(p.part, p.r, p.r + 1, await window(p), p);
    }
    const from = layout.ssm[1].start;
    await assert.rejects(
      imp.commit(),
      new RegExp(`conv/ssm snapshot bytes \\[${from}, ${from + PIECE}\\) missing`),
    );
    assert.equal(imp.state, "staging");
    await imp.abort();
    assert.equal(pair.b.seqPosMax(0), -1);
  },
});

Deno.test("[public] pieces are held, checked and joined into llama.cpp's own import", async () => {
  using pair = await HandoffPair.open("hybrid");
  const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
  const whole = await pair.a.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const split = splitRecurrent(whole);
  assert.equal(split.layout, "split");
  if (split.layout !== "split") return;
  const spans = entrySpans(split);
  const base = split.conv.byteLength;
  const layout = {
    conv: spans.conv,
    ssm: spans.ssm.map((e) => ({ start: e.start + base, end: e.end + base })),
  };
  const pieces = piecesOf(layout);
  const stage = async (skip?: Piece) => {
    const imp = await StagedImport.open(pair.b, { nTokens: N, path: "public" });
    for (const page of state.pages) await imp.addPage(page);
    for (const p of shuffled(pieces)) {
      if (p === skip) continue;
      await imp.addRecurrentLayers(p.part, p.r, p.r + 1, whole.subarray(p.from, p.to), p);
    }
    return imp;
  };
  // One piece missing: the join names the run and the bytes.
  const gap = pieces.find((p) => p.part === "ssm" && p.r === 2 && p.offset === PIECE)!;
  const holed = await stage(gap);
  await assert.rejects(
    holed.commit(),
    /ssm of recurrent layers \[2, 3\) bytes \[1000, 2000\) missing/,
  );
  await holed.abort();
  const imp = await stage();
  await imp.commit();
  assert.deepEqual(await pair.b.stateSeqGet(0, 0), await pair.a.stateSeqGet(0, 0));
});
