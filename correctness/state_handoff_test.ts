import assert from "node:assert/strict";
import { IdentityMismatchError, StateValidationError } from "../core/errors.ts";
import { ensureModelFile } from "../models/mod.ts";
import { RUNTIME_DEFAULTS, type RuntimeConfig } from "../serve/engine.ts";
import { testModel } from "../testing/models.ts";
import {
  adoptHandoff,
  compareContinuations,
  type Continuation,
  continueGreedy,
  DecoderModel,
  openHandoff,
  type PrefillResult,
  prefillSide,
  Side,
  stageAndCommit,
  syntheticPrompt,
} from "./state_handoff.ts";

const N = 1024;
const PAGE = 256;
const STEPS = 12;
const MODELS = new URL("../.cache/test-models", import.meta.url).pathname;

async function config(family: string, over: Partial<RuntimeConfig> = {}): Promise<RuntimeConfig> {
  return {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel(family),
    nCtx: 2048,
    chunkTokens: PAGE,
    mtp: family === "hybrid-moe-mtp",
    swaFull: false,
    ...over,
  };
}

/** Opens A on `family`, prefills N tokens and returns it with what it exported. */
async function prefilled(family: string): Promise<{ a: Side; p: PrefillResult }> {
  const a = await Side.open(await config(family));
  const tokens = syntheticPrompt(N, a.engine.model.vocab.nTokens, 7);
  return { a, p: await prefillSide(a, tokens) };
}

/** B never decoded anything: empty sequence, position 0, no import holding it, no eval time. */
function assertUntouched(b: Side) {
  assert.equal(b.engine.ctx.seqPosMax(0), -1);
  assert.equal(b.engine.position, 0);
  assert.equal(b.engine.ctx.heldBy, null);
  const perf = b.engine.ctx.perf();
  assert.equal(perf.promptMs + perf.evalMs, 0, "the decoder evaluated tokens");
}

Deno.test("the identity gate refuses every numerical mismatch before any state reaches the decoder", async (t) => {
  const { a, p } = await prefilled("hybrid");
  using _a = a;
  const otherModel = await ensureModelFile(MODELS, { family: "hybrid", seed: 1 });
  const cases: [string, Partial<RuntimeConfig>, RegExp][] = [
    ["another K/V type", { typeK: "f32", typeV: "f32" }, /K cache type: .*V cache type: /],
    ["flash attention on", { flashAttention: true }, /flash attention: expected true, found false/],
    ["another thread count", { threads: 1 }, /thread count: expected 1, found 2/],
    ["a context too small", { nCtx: N }, /context size: expected >= 1036, found 1024/],
    ["another model file", { modelPath: otherModel }, /model file digest: expected \w{12}, found/],
  ];
  for (const [what, over, fields] of cases) {
    await t.step(`a decoder with ${what} is refused, naming the fields`, async () => {
      using b = await Side.open(await config("hybrid", over));
      const error = await openHandoff(b, a.identity, p.state.nTokens, STEPS).then(
        () => null,
        (e: Error) => e,
      );
      assert.ok(error instanceof IdentityMismatchError, String(error));
      assert.match(error.message, /^Peer identity does not match: /);
      assert.match(error.message, fields);
      assertUntouched(b);
    });
  }
  await t.step("the same settings on a separate model instance pass the gate", async () => {
    using b = await Side.open(await config("hybrid"));
    const imp = await openHandoff(b, a.identity, p.state.nTokens, STEPS);
    assert.equal(imp.state, "staging");
    await imp.abort();
  });
});

/** Hands `p` to a fresh decoder on its own model instance, commits, continues STEPS tokens. */
async function handOffAndContinue(family: string, a: Side, p: PrefillResult, order?: number[]) {
  using bModel = await DecoderModel.load(await config(family));
  using b = await bModel.openSide();
  assertUntouched(b);
  const imp = await openHandoff(b, a.identity, p.state.nTokens, STEPS);
  const timings = await stageAndCommit(imp, p.state, { order });
  assert.equal(imp.state, "committed");
  adoptHandoff(b, p.state.nTokens, timings.mtpHidden);
  return await continueGreedy(b, p.firstToken, STEPS);
}

Deno.test("hybrid-moe-mtp: target logits, draft tokens and draft logits match bit for bit after the handoff", async () => {
  const { a, p } = await prefilled("hybrid-moe-mtp");
  using _a = a;
  const local = await continueGreedy(a, p.firstToken, STEPS);
  const moved = await handOffAndContinue("hybrid-moe-mtp", a, p, [3, 1, 0, 2]);
  assert.equal(moved.draftLogits.length, STEPS);
  const parity = compareContinuations(local, moved);
  assert.deepEqual(parity, {
    exact: true,
    tokensEqual: true,
    maxAbsDiff: 0,
    firstDiffStep: null,
    steps: STEPS,
  });
  assert.ok(new Set(local.tokens).size > 1, "degenerate target continuation");
  assert.ok(new Set(local.draftTokens).size > 1, "degenerate draft");
});

Deno.test("hybrid-moe-mtp: a draft that lost its pending hidden row is caught as a difference", async () => {
  const { a, p } = await prefilled("hybrid-moe-mtp");
  using _a = a;
  const local = await continueGreedy(a, p.firstToken, STEPS);
  using bModel = await DecoderModel.load(await config("hybrid-moe-mtp"));
  using b = await bModel.openSide();
  const imp = await openHandoff(b, a.identity, p.state.nTokens, STEPS);
  await stageAndCommit(imp, p.state);
  adoptHandoff(b, p.state.nTokens, new Float32Array(b.engine.ctx.nEmbd)); // zeros, not the row
  const moved = await continueGreedy(b, p.firstToken, STEPS);
  const parity = compareContinuations(local, moved);
  assert.equal(parity.exact, false);
  assert.equal(parity.firstDiffStep, 0);
  assert.ok(parity.maxAbsDiff > 0);
  // The target itself is unaffected: only the draft comparison caught it.
  const targetOnly = (c: Continuation) => ({ ...c, draftTokens: [], draftLogits: [] });
  assert.equal(compareContinuations(targetOnly(local), targetOnly(moved)).exact, true);
});

Deno.test("dense: a flipped page is refused naming its range; the decoder stays uncommitted, cannot decode, and is empty after abort", async () => {
  const { a, p } = await prefilled("dense");
  using _a = a;
  using bModel = await DecoderModel.load(await config("dense"));
  using b = await bModel.openSide();
  const imp = await openHandoff(b, a.identity, p.state.nTokens, STEPS);
  await assert.rejects(
    stageAndCommit(imp, p.state, { flipPage: 2 }),
    (e: Error) =>
      e instanceof StateValidationError && /kv-page tokens \[512, 768\).*checksum/.test(e.message),
  );
  assert.equal(imp.state, "staging");
  assert.equal(b.engine.ctx.seqPosMax(0), 511, "the two pages before the flipped one are staged");
  await assert.rejects(b.engine.step(5), /uncommitted state import/);
  // Staging stopped at the flipped page: everything from it on is missing.
  await assert.rejects(imp.commit(), /kv-page tokens \[512, 1024\) missing/);
  await imp.abort();
  assertUntouched(b);
});

Deno.test("compareContinuations() catches a one-ulp difference in one logit and reports its step", () => {
  const row = () => Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
  const mk = (): Continuation => ({
    tokens: [1, 2, 3],
    logits: [row(), row(), row()],
    draftTokens: [],
    draftLogits: [],
  });
  const local = mk();
  assert.equal(compareContinuations(local, mk()).exact, true);
  const moved = mk();
  const bits = new Uint32Array(moved.logits[1].buffer);
  bits[7] += 1;
  const parity = compareContinuations(local, moved);
  assert.equal(parity.exact, false);
  assert.equal(parity.tokensEqual, true);
  assert.equal(parity.firstDiffStep, 1);
  assert.ok(parity.maxAbsDiff > 0 && parity.maxAbsDiff < 1e-6);
  const otherTokens = { ...mk(), tokens: [1, 2, 4] };
  assert.equal(compareContinuations(local, otherTokens).exact, false);
});
