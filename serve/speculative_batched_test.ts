/**
 * A request that asks for speculation on a batching decode worker (the default path) is
 * routed from the shared batched context to a context of its own, named in telemetry
 * (`route: "batch-to-session"`), and speculates there: greedy tokens equal a lone target-only
 * run's, and a seeded sampled stream equals colocated speculation's. In this process on real
 * QUIC, tiny hybrid model; the routed context is gone when the request ends.
 */
import assert from "node:assert/strict";
import {
  HANG_MS,
  hybridTrio,
  promptOf,
  RUNTIME,
  SAMPLING,
  startInProcess,
  waitForIdle,
} from "./_failure_harness.ts";
import { runHandoff } from "./coordinator.ts";
import { SequencePool } from "./batch_pool.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { nRsSeqFor, prefillWithDraft, runColocated, SPECULATION_DEFAULTS } from "./speculative.ts";

const N = 16;

Deno.test({
  name: "batching decode worker: a speculating request is routed to a context of its own",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model);
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model);
    try {
      assert.ok(decode.worker!.sessions instanceof SequencePool, "the decode worker batches");
      const prompt = promptOf(6);
      const run = (over = {}) =>
        runHandoff(client, {
          prefill: prefill.peer,
          decode: decode.peer,
          prompt,
          generateTokens: N,
          sampling: SAMPLING,
          tenantId: "tenant-a",
          probe: false,
          timeoutMs: HANG_MS,
          ...over,
        });
      // The reference: target-only, every step decoded alone (bitwise equal to a lone context).
      const alone = await run({ probe: true });
      const spec = await run({ speculation: "suffix" });
      assert.equal(spec.placement, "disaggregated", spec.fallbackReason ?? "");
      assert.deepEqual(spec.tokens, alone.tokens);
      const s = spec.telemetry.speculation!;
      assert.equal(s.route, "batch-to-session");
      assert.equal(s.fallback, null);
      assert.equal(s.rollback, "native");
      assert.ok(s.rounds > 0, "verify steps ran on the routed context");
      assert.equal(alone.telemetry.speculation, undefined, "no speculation asked, none ran");

      // Sampled: the routed context continues the prefiller's sampler state, so the stream
      // equals colocated sampled speculation's.
      const sampling = { temperature: 0.5, topK: 20, topP: 1, seed: 7 };
      const sampled = await run({ speculation: "suffix", sampling });
      const { seed, ...params } = sampling;
      const config = { ...SPECULATION_DEFAULTS, mode: "suffix" as const };
      using engine = await Engine.open({
        ...RUNTIME_DEFAULTS,
        ...RUNTIME,
        modelPath: model,
        nRsSeq: nRsSeqFor(config),
      });
      const tokens = engine.model.vocab.tokenize(prompt);
      const logits = await prefillWithDraft(engine, null, tokens);
      const colocated = runColocated(engine, null, tokens, logits, N, params, {
        seed,
        draws: 0,
      }, config);
      const want: number[] = [];
      for await (const step of colocated.steps) want.push(step.token);
      assert.deepEqual(sampled.tokens, want);
      assert.notDeepEqual(sampled.tokens, alone.tokens, "sampled, not greedy");
      assert.equal(sampled.telemetry.speculation!.route, "batch-to-session");

      await waitForIdle(decode, HANG_MS);
      const stats = await decode.stats();
      assert.equal(stats.sequencesBusy, 0);
      assert.equal(stats.kvCellsUsed, 0);
    } finally {
      await prefill.stop();
      await decode.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
