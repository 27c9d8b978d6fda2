import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { MtpDraft } from "../ffi/mtp.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import { samplingDistribution, type SamplingParams } from "../core/sampling.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { selfRepeatingPrompt } from "../testing/speculation_prompt.ts";
import {
  nRsSeqFor,
  prefillWithDraft,
  runColocated,
  SPECULATION_DEFAULTS,
  type SpeculationConfig,
  type SpeculationReport,
  type SpeculativeStep,
} from "./speculative.ts";

const N = 32;

const prompts = new Map<string, Int32Array>();

/** A repetitive prompt for `family` on which the suffix proposer must fire and be accepted. */
async function repetitivePrompt(family: string): Promise<Int32Array> {
  const known = prompts.get(family);
  if (known) return known;
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel(family),
    nCtx: 1024,
  });
  const prompt = await selfRepeatingPrompt(engine);
  prompts.set(family, prompt);
  return prompt;
}

const references = new Map<string, number[]>();

/** Target-only tokens from a plain engine (its own model, no MTP, no snapshots); memoized. */
async function targetOnly(
  family: string,
  prompt: Int32Array,
  sampling: SamplingParams = { temperature: 0 },
): Promise<number[]> {
  const key = JSON.stringify([family, Array.from(prompt), sampling]);
  const known = references.get(key);
  if (known) return known;
  const tokens = await targetOnlyRun(family, prompt, sampling);
  references.set(key, tokens);
  return tokens;
}

async function targetOnlyRun(family: string, prompt: Int32Array, sampling: SamplingParams) {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel(family),
    nCtx: 1024,
  });
  const logits = await engine.prefill(prompt);
  const tokens: number[] = [];
  for await (const s of engine.generate(logits, N, sampling, { seed: 7, draws: 0 })) {
    tokens.push(s.token);
  }
  return tokens;
}

async function speculative(
  family: string,
  prompt: Int32Array,
  mode: SpeculationMode,
  sampling: SamplingParams = { temperature: 0 },
): Promise<{ tokens: number[]; report: SpeculationReport }> {
  const { steps, report } = await speculativeSteps(family, prompt, mode, sampling, 7);
  return { tokens: steps.map((s) => s.token), report };
}

async function speculativeSteps(
  family: string,
  prompt: Int32Array,
  mode: SpeculationMode,
  sampling: SamplingParams,
  seed: number,
): Promise<{ steps: SpeculativeStep[]; report: SpeculationReport }> {
  const mtp = family === "hybrid-moe-mtp";
  using model = await LlamaModel.load(loadLlama(), await testModel(family), { loadMtp: mtp });
  const config: SpeculationConfig = { ...SPECULATION_DEFAULTS, mode };
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: model.path,
    nCtx: 1024,
    mtp,
    nRsSeq: nRsSeqFor(config),
  }, model);
  using draft = mtp ? await MtpDraft.open(engine.ctx) : null;
  const logits = await prefillWithDraft(engine, draft, prompt);
  const run = runColocated(engine, draft, prompt, logits, N, sampling, { seed, draws: 0 }, config);
  const steps: SpeculativeStep[] = [];
  for await (const s of run.steps) steps.push({ token: s.token, logits: s.logits.slice() });
  return { steps, report: run.report()! };
}

for (const family of ["hybrid", "recurrent"]) {
  Deno.test(`${family}: suffix speculation fires on a repetitive prompt and keeps the tokens`, async () => {
    const prompt = await repetitivePrompt(family);
    const want = await targetOnly(family, prompt);
    const { tokens, report } = await speculative(family, prompt, "suffix");
    const c = report.counters;
    console.log(`${family} suffix: ${JSON.stringify({ rollback: report.rollback, ...c })}`);
    assert.deepEqual(tokens, want);
    assert.equal(report.fallback, null);
    assert.ok(c.suffixDrafted > 0, "the proposer fired");
    assert.ok(c.suffixAccepted > 0, "some drafts were accepted");
    assert.equal(c.mtpDrafted, 0);
    assert.ok(c.rounds < N - 1, "fewer verify decodes than tokens");
  });
}

for (const mode of ["mtp", "mtp+suffix"] as const) {
  Deno.test(`hybrid-moe-mtp: ${mode} speculation keeps the target-only tokens`, async () => {
    const prompt = await repetitivePrompt("hybrid-moe-mtp");
    const want = await targetOnly("hybrid-moe-mtp", prompt);
    const { tokens, report } = await speculative("hybrid-moe-mtp", prompt, mode);
    const c = report.counters;
    console.log(`hybrid-moe-mtp ${mode}: ${JSON.stringify({ rollback: report.rollback, ...c })}`);
    assert.deepEqual(tokens, want);
    assert.equal(report.fallback, null);
    assert.equal(report.mtpReadiness, "lagging-one", "verified at the start, one token behind");
    assert.equal(report.rollback, "native");
    assert.ok(c.mtpDrafted > 0, "MTP drafted");
    assert.ok(c.mtpAccepted <= c.mtpDrafted && c.suffixAccepted <= c.suffixDrafted);
    if (mode === "mtp+suffix") {
      assert.ok(c.suffixDrafted > 0 && c.suffixAccepted > 0, "the suffix fired and was accepted");
    }
  });
}

for (const family of ["hybrid", "recurrent"]) {
  Deno.test(`${family}: sampled suffix speculation keeps the seeded target-only stream`, async () => {
    const prompt = await repetitivePrompt(family);
    // Random-weight logits are nearly flat (the top token has p = 0.25 at temperature 0.2 on
    // the tiny hybrid), so a low temperature keeps the stream on the repeating text where the
    // proposer fires; every accept test and token is still a draw.
    const sampling = { temperature: 0.02, topK: 20 };
    const run = (seed: number) => speculativeSteps(family, prompt, "suffix", sampling, seed);
    const a = await run(7);
    const c = a.report.counters;
    console.log(`${family} sampled suffix: ${JSON.stringify(c)}`);
    assert.equal(a.report.fallback, null, "sampled requests speculate");
    assert.ok(c.suffixDrafted > 0 && c.rounds > 0, "drafts were verified");
    assert.ok(c.suffixAccepted > 0, "some drafts were accepted under the sampler");
    assert.ok(c.suffixAccepted < c.suffixDrafted, "and some rejected (drawn from the residual)");
    // Each token lies in the kept set of the target distribution it was emitted from.
    for (const s of a.steps) {
      assert.ok(samplingDistribution(s.logits, sampling).ids.includes(s.token));
    }
    // Token for token the target-only stream of the same seed (one draw per token).
    assert.deepEqual(a.steps.map((s) => s.token), await targetOnly(family, prompt, sampling));
    // The same seed gives the same stream and the same rounds; another seed another stream.
    const again = await run(7);
    assert.deepEqual(again.steps.map((s) => s.token), a.steps.map((s) => s.token));
    assert.deepEqual(again.report.counters, c);
    const other = await run(8);
    assert.notDeepEqual(other.steps.map((s) => s.token), a.steps.map((s) => s.token));
  });
}

Deno.test("MTP asked for on a model without MTP names the fallback and still speculates", async () => {
  const prompt = await repetitivePrompt("hybrid");
  const want = await targetOnly("hybrid", prompt);
  const { tokens, report } = await speculative("hybrid", prompt, "mtp+suffix");
  assert.deepEqual(tokens, want);
  assert.equal(report.fallback, "mtp-unavailable");
  assert.equal(report.counters.mtpDrafted, 0);
  assert.ok(report.counters.suffixDrafted > 0);
});

Deno.test("an MTP draft that was never caught up is not ready, and telemetry says so", async () => {
  const prompt = await repetitivePrompt("hybrid-moe-mtp");
  const want = await targetOnly("hybrid-moe-mtp", prompt);
  using model = await LlamaModel.load(loadLlama(), await testModel("hybrid-moe-mtp"), {
    loadMtp: true,
  });
  const config: SpeculationConfig = { ...SPECULATION_DEFAULTS, mode: "mtp" };
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: model.path,
    nCtx: 1024,
    mtp: true,
    nRsSeq: nRsSeqFor(config),
  }, model);
  using draft = await MtpDraft.open(engine.ctx);
  const logits = await engine.prefill(prompt); // the draft is left empty: must re-prime
  const run = runColocated(engine, draft, prompt, logits, N, { temperature: 0 }, {
    seed: 7,
    draws: 0,
  }, config);
  const tokens: number[] = [];
  for await (const s of run.steps) tokens.push(s.token);
  assert.deepEqual(tokens, want);
  assert.equal(run.report()!.mtpReadiness, "not-ready");
  assert.equal(run.report()!.fallback, "mtp-not-ready");
  assert.equal(run.report()!.counters.mtpDrafted, 0);
});
