/**
 * MTP speculation after an in-process handoff (the real staged import of correctness/): the
 * decoder's MTP readiness is verified, its first drafts equal the colocated drafts bit for
 * bit, and every token equals colocated speculation's and target-only greedy decoding's. The
 * decoder context keeps n_rs_seq snapshots while the prefiller's does too (measured
 * numerically neutral: ffi/verify_test.ts).
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { selfRepeatingPrompt } from "../testing/speculation_prompt.ts";
import {
  adoptHandoff,
  DecoderModel,
  openHandoff,
  prefillSide,
  type Side,
  Side as SideClass,
  stageAndCommit,
} from "../correctness/state_handoff.ts";
import { Engine, RUNTIME_DEFAULTS, type RuntimeConfig } from "./engine.ts";
import { SPECULATION_DEFAULTS, SpeculativeDecoder } from "./speculative.ts";

const N = 32;

function bytesOf(f: Float32Array): Uint8Array {
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
}

/** Steps the first token alone (colocated: its own step; decoder: the probe), then speculates. */
async function speculate(side: Side, prompt: Int32Array, first: number) {
  const logits = await side.engine.step(first);
  const readiness = side.draft!.readiness(side.engine.position);
  const drafts: Uint8Array[][] = [];
  const decoder = new SpeculativeDecoder(
    side.engine,
    side.draft,
    [...prompt, first],
    { temperature: 0 },
    side.engine.config.speculation!,
    { onMtpDraft: (_t, rows) => drafts.push(rows.map((r) => bytesOf(r).slice())) },
  );
  const tokens = [first];
  for await (const s of decoder.generate(logits, N - 1, { seed: 0, draws: 0 })) {
    tokens.push(s.token);
  }
  return { tokens, readiness, drafts, report: decoder.report };
}

Deno.test("hybrid-moe-mtp: after a handoff, MTP drafts equal the colocated ones bitwise", async () => {
  const config: RuntimeConfig = {
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("hybrid-moe-mtp"),
    nCtx: 1024,
    chunkTokens: 32,
    mtp: true,
    speculation: { ...SPECULATION_DEFAULTS, mode: "mtp+suffix" },
  };
  using a = await SideClass.open(config);
  const prompt = await selfRepeatingPrompt(a.engine);
  const want: number[] = [];
  {
    using plain = await Engine.open({
      ...RUNTIME_DEFAULTS,
      modelPath: config.modelPath,
      nCtx: 1024,
    });
    const logits = await plain.prefill(prompt);
    for await (const s of plain.generate(logits, N, { temperature: 0 }, { seed: 0, draws: 0 })) {
      want.push(s.token);
    }
  }
  const { state, firstToken } = await prefillSide(a, prompt);
  assert.equal(firstToken, want[0]);

  using dm = await DecoderModel.load(config);
  using b = await dm.openSide();
  const imp = await openHandoff(b, a.identity, prompt.length, N);
  const { mtpHidden } = await stageAndCommit(imp, state);
  adoptHandoff(b, prompt.length, mtpHidden);
  assert.equal(b.draft!.readiness(b.engine.position + 1), "lagging-one");

  const colocated = await speculate(a, prompt, firstToken);
  const moved = await speculate(b, prompt, firstToken);
  assert.equal(moved.readiness, "lagging-one", "verified, one token behind after the probe");
  assert.equal(moved.report.fallback, null);
  assert.ok(moved.drafts.length > 0, "MTP drafted after the handoff");
  assert.deepEqual(moved.drafts[0], colocated.drafts[0], "first drafts bitwise equal");
  assert.deepEqual(moved.drafts, colocated.drafts, "every draft bitwise equal");
  assert.deepEqual(moved.tokens, colocated.tokens);
  assert.deepEqual(moved.tokens, want, "speculation keeps target-only greedy tokens");
  assert.deepEqual(moved.report.counters, colocated.report.counters);
  const c = moved.report.counters;
  console.log(`after handoff, mtp+suffix: ${JSON.stringify(c)}`);
  assert.ok(c.suffixAccepted > 0, "the suffix proposer fired and was accepted");
});
