import assert from "node:assert/strict";
import { LlamaBatch } from "./batch.ts";
import { bits, HandoffPair, prompt } from "./_state_testing.ts";
import {
  argmax,
  type ExportedState,
  greedyLogits,
  importExported,
  prefillAndExport,
} from "./state_driver.ts";
import { exportKvPage, exportRecurrent, exportSwa, joinRecurrent, stateBackend } from "./state.ts";
import { loadLlama } from "./library.ts";
import { loadShim } from "./shim/shim.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";

const N = 1024;
const CHUNK = 256;
const STEPS = 16;
const shim = await loadShim(loadLlama());

/** A test that needs the native shim; skipped, saying why, when it is unavailable. */
function shimTest(name: string, fn: () => Promise<void>) {
  const why = shim.ok ? "" : ` (skipped: native shim unavailable: ${shim.reason})`;
  Deno.test({ name: name + why, ignore: !shim.ok, fn });
}

/** Continues A locally and B after the handoff; asserts identical tokens and bitwise logits. */
async function assertContinuesExactly(pair: HandoffPair, state: ExportedState) {
  const last = pair.a.logits();
  const first = argmax(last);
  const local = await greedyLogits(pair.a, first, state.nTokens, STEPS);
  const moved = await greedyLogits(pair.b, first, state.nTokens, STEPS);
  for (let k = 0; k < STEPS; k++) assert.deepEqual(bits(moved[k]), bits(local[k]), `step ${k}`);
  assert.ok(new Set(local.map(argmax)).size > 1, "degenerate continuation");
}

/** One MTP draft step on each side from the pending row: the draft logits must match. */
async function assertDraftMatches(pair: HandoffPair, state: ExportedState, hidden: Float32Array) {
  const token = argmax(pair.a.logits());
  const logits = [];
  for (const d of [pair.draftA!, pair.draftB!]) {
    const batch = new LlamaBatch(1, pair.a.nEmbd);
    batch.add(token, state.nTokens, true, 0, hidden);
    await d.decode(batch);
    logits.push(d.logits());
  }
  assert.deepEqual(bits(logits[1]), bits(logits[0]));
}

/** ISWA handoffs need the shim (see exportSwa); the other families also run without it. */
function familyTest(family: string, name: string, fn: () => Promise<void>) {
  if (family === "iswa") shimTest(name, fn);
  else Deno.test(name, fn);
}

for (const family of ["dense", "hybrid", "iswa", "recurrent", "hybrid-moe-mtp"]) {
  familyTest(
    family,
    `${family}: pages and final snapshot continue bit-exactly on another model instance`,
    async () => {
      using pair = await HandoffPair.open(family, family === "iswa" ? { swaFull: false } : {});
      const state = await prefillAndExport(pair.a, prompt(N), {
        chunkTokens: CHUNK,
        draft: pair.draftA,
      });
      const { imp } = await importExported(pair.b, state, { draft: pair.draftB });
      assert.equal(imp.state, "committed");
      const committed = await imp.commit().catch(() => null); // already committed: refused
      assert.equal(committed, null);
      if (pair.draftA) {
        await assertDraftMatches(pair, state, new Float32Array(state.mtpHidden!.slice().buffer));
      }
      await assertContinuesExactly(pair, state);
    },
  );
}

for (
  const [family, over] of [
    ["hybrid", { flashAttention: true }],
    ["iswa", { flashAttention: true, swaFull: false }],
    ["iswa", { swaFull: true }],
    ["dense", { kvUnified: false, nSeqMax: 2, nCtx: 4096 }],
  ] as const
) {
  familyTest(
    family,
    `${family} ${JSON.stringify(over)}: the handoff continues bit-exactly`,
    async () => {
      using pair = await HandoffPair.open(family, over);
      const state = await prefillAndExport(pair.a, prompt(N, 4), { chunkTokens: CHUNK });
      await importExported(pair.b, state, { order: [1, 3, 0, 2] });
      await assertContinuesExactly(pair, state);
    },
  );
}

for (const family of ["dense", "hybrid"]) {
  shimTest(`${family}: pages staged in shuffled order still continue bit-exactly`, async () => {
    using pair = await HandoffPair.open(family);
    const state = await prefillAndExport(pair.a, prompt(N, 1), { chunkTokens: CHUNK });
    const { imp } = await importExported(pair.b, state, { order: [2, 0, 3, 1] });
    assert.equal(imp.path, "shim");
    // The decoder's whole sequence state is byte-identical to the prefiller's.
    assert.deepEqual(await pair.b.stateSeqGet(0), await pair.a.stateSeqGet(0));
    await assertContinuesExactly(pair, state);
  });
}

for (const path of ["public", "cross"] as const) {
  Deno.test(`hybrid: the public fallback (${path}) continues bit-exactly`, async () => {
    using pair = await HandoffPair.open("hybrid");
    // cross: pages made by the shim (when present), staged through the public path.
    const exportPath = path === "public" ? "public" : "auto";
    const state = await prefillAndExport(pair.a, prompt(N, 2), {
      chunkTokens: CHUNK,
      path: exportPath,
    });
    const { imp } = await importExported(pair.b, state, { path: "public", order: [3, 1, 0, 2] });
    assert.equal(imp.path, "public");
    await assertContinuesExactly(pair, state);
  });
}

shimTest(
  "dense: pages made by the public fallback import through the shim bit-exactly",
  async () => {
    using pair = await HandoffPair.open("dense");
    const state = await prefillAndExport(pair.a, prompt(N, 3), {
      chunkTokens: CHUNK,
      path: "public",
    });
    const { imp } = await importExported(pair.b, state, { order: [1, 0, 3, 2] });
    assert.equal(imp.path, "shim");
    await assertContinuesExactly(pair, state);
  },
);

Deno.test("hybrid: the recurrent snapshot splits into conv and ssm and joins back byte for byte", async () => {
  using pair = await HandoffPair.open("hybrid");
  await prefillAndExport(pair.a, prompt(300), { chunkTokens: CHUNK });
  const whole = await pair.a.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const snap = await exportRecurrent(pair.a);
  assert.equal(snap.layout, "split");
  if (snap.layout !== "split") return;
  // The tiny hybrid has 4 Mamba layers: conv (d_conv-1) x (d_inner + 2 n_group d_state) x 4 B
  // and SSM d_state x d_inner x 4 B each, plus 12 B of type and row size per layer.
  assert.equal(snap.ssm.byteLength, 4 * (12 + 16 * 256 * 4));
  assert.equal(snap.conv.byteLength - (whole.byteLength - snap.ssm.byteLength), 0);
  assert.deepEqual(joinRecurrent(snap), whole);
});

Deno.test("a page export before its chunk is decoded is refused with the range", async () => {
  using pair = await HandoffPair.open("dense");
  await prefillAndExport(pair.a, prompt(CHUNK), { chunkTokens: CHUNK });
  await assert.rejects(exportKvPage(pair.a, CHUNK, 2 * CHUNK), /kv-page tokens \[256, 512\)/);
  await assert.rejects(
    exportKvPage(pair.a, CHUNK, 2 * CHUNK, { path: "public" }),
    /kv-page tokens \[256, 512\)/,
  );
});

Deno.test("the backend says which path a context uses and why", async () => {
  using pair = await HandoffPair.open("dense");
  const forced = await stateBackend(pair.a, "public");
  assert.equal(forced.path, "public");
  assert.equal(forced.kind, "kv");
  const auto = await stateBackend(pair.a);
  assert.equal(auto.path, shim.ok ? "shim" : "public");
  assert.equal(auto.reason === null, shim.ok);
});

Deno.test("iswa: the sliding-window cache is not exported without the shim", async () => {
  using pair = await HandoffPair.open("iswa", { swaFull: false });
  await prefillAndExport(pair.a, prompt(300), { chunkTokens: CHUNK, path: "public" }).catch(
    () => {},
  );
  await assert.rejects(
    exportSwa(pair.a, { path: "public" }),
    /swa-kv exactly without the native shim/,
  );
});

shimTest(
  "iswa: a shim-made window cache goes through the public import when it is full-size",
  async () => {
    using pair = await HandoffPair.open("iswa", { swaFull: true });
    const state = await prefillAndExport(pair.a, prompt(N, 6), { chunkTokens: CHUNK });
    await importExported(pair.b, state, { path: "public", order: [3, 2, 1, 0] });
    await assertContinuesExactly(pair, state);
  },
);
