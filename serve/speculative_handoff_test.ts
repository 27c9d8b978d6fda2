/**
 * Speculation after an in-process handoff (the real staged import of correctness/): the
 * decoder's MTP readiness is verified, its drafts equal the colocated drafts bit for bit, and
 * every token equals colocated speculation's and target-only greedy decoding's. Both contexts
 * keep n_rs_seq snapshots (measured numerically neutral: ffi/verify_test.ts).
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { runSpeculationCase } from "../correctness/speculation.ts";

const options = { steps: 32, modelFor: (family: string) => testModel(family) };

Deno.test("hybrid-moe-mtp mtp+suffix: after a handoff, MTP drafts equal the colocated ones bitwise", async () => {
  const r = await runSpeculationCase({
    family: "hybrid-moe-mtp",
    preset: "tiny",
    promptTokens: 96,
    chunkTokens: 32,
    mode: "mtp+suffix",
  }, options);
  console.log(`after handoff, mtp+suffix: ${JSON.stringify(r.moved?.counters)}`);
  assert.equal(r.verdict, "exact");
  assert.equal(r.draftsBitwise, true, "every MTP draft bitwise equal");
  assert.ok(r.tokensEqual && r.targetEqual);
  assert.equal(r.moved!.mtpReadiness, "lagging-one", "verified, one token behind after the probe");
  assert.equal(r.moved!.rollback, "native");
  assert.deepEqual(r.moved!.counters, r.colocated!.counters);
  assert.ok(r.moved!.counters.mtpDrafted > 0, "MTP drafted after the handoff");
  assert.ok(r.moved!.counters.suffixAccepted > 0, "the suffix proposer fired and was accepted");
});

Deno.test("hybrid suffix and target-only after a handoff; MTP modes are n/a without MTP", async () => {
  for (const mode of ["suffix", "target-only", "mtp"] as const) {
    const r = await runSpeculationCase({
      family: "hybrid",
      preset: "tiny",
      promptTokens: 96,
      chunkTokens: 32,
      mode,
    }, options);
    if (mode === "mtp") {
      assert.equal(r.verdict, "n/a");
      continue;
    }
    assert.equal(r.verdict, "exact", mode);
    assert.equal(r.draftsBitwise, null);
    if (mode === "suffix") assert.ok(r.moved!.counters.suffixAccepted > 0);
    else assert.equal(r.moved!.counters.rounds, 0);
  }
});
