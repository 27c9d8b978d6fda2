/**
 * A decode worker with continuous batching (the default), in this process on real QUIC, tiny
 * hybrid model: concurrent disaggregated handoffs land in free sequences of the shared context
 * and generate in shared steps; requests with per-token logits digests (`probe`) decode alone
 * and stay bitwise equal to a lone run; admission refuses with a busy outcome; and
 * the stats report sequence, cell and RSS usage, all returned to zero afterwards.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import {
  HANG_MS,
  makeNodes,
  promptOf,
  SAMPLING,
  startInProcess,
  type TestWorker,
  waitForIdle,
} from "./_failure_harness.ts";
import { runHandoff } from "./coordinator.ts";
import type { Node } from "./node.ts";
import { SequencePool } from "./batch_pool.ts";

const PROMPTS = [4, 9, 15, 22].map((n) => promptOf(n));

function run(client: Node, p: TestWorker, d: TestWorker, prompt: string, over = {}) {
  return runHandoff(client, {
    prefill: p.peer,
    decode: d.peer,
    prompt,
    generateTokens: 10,
    sampling: SAMPLING,
    tenantId: "tenant-a",
    probe: true,
    timeoutMs: HANG_MS,
    ...over,
  });
}

Deno.test({
  name: "batched decode worker: concurrent handoffs, exact probes, admission, stats",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const model = await testModel("hybrid");
    const { dir, nodes } = await makeNodes(["prefill", "decode", "small", "off", "client"]);
    const client = nodes.get("client")!;
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
      sessionsMax: 4,
    });
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model, {
      sessionsMax: 4,
    });
    // One sequence, nobody may wait: the second concurrent request is refused busy.
    const small = await startInProcess("small", "decode", `${dir}/small`, model, {
      sessionsMax: 1,
      admission: { queueDepthMax: 0, queueWaitMs: 0 },
    });
    try {
      const pool = decode.worker!.sessions;
      assert.ok(pool instanceof SequencePool, "the decode worker batches by default");

      // One at a time first: the reference.
      const alone: Awaited<ReturnType<typeof run>>[] = [];
      for (const prompt of PROMPTS) alone.push(await run(client, prefill, decode, prompt));

      await t.step("four concurrent handoffs: committed into sequences, probes exact", async () => {
        const runs = await Promise.all(PROMPTS.map((p) => run(client, prefill, decode, p)));
        for (const [i, r] of runs.entries()) {
          assert.equal(r.placement, "disaggregated", r.fallbackReason ?? "");
          assert.deepEqual(r.tokens, alone[i].tokens);
          assert.deepEqual(r.logitsSha256, alone[i].logitsSha256);
        }
      });

      await t.step("without probe digests, concurrent streams share steps", async () => {
        const steps0 = pool.loop.totals.steps;
        const tokens0 = pool.loop.totals.decodeTokens;
        // The others start once a long stream is generating, so they join it (counted in
        // events: four streams of 10 tokens started together need not overlap on a slow host).
        let joined: Promise<Awaited<ReturnType<typeof run>>[]> | null = null;
        const long = await run(client, prefill, decode, PROMPTS[0], {
          probe: false,
          generateTokens: 600,
          onText: () => {
            joined ??= Promise.all(
              PROMPTS.slice(1).map((p) => run(client, prefill, decode, p, { probe: false })),
            );
          },
        });
        const runs = await joined!;
        assert.equal(long.tokens.length, 600);
        for (const r of runs) assert.equal(r.tokens.length, 10);
        assert.ok(pool.loop.totals.sequencesPerStepMax >= 2);
        // Fewer steps than decode tokens: some steps carried several streams.
        assert.ok(pool.loop.totals.steps - steps0 < pool.loop.totals.decodeTokens - tokens0);
      });

      await t.step("no sequence free and no room to wait: refused busy", async () => {
        const colocated = { colocated: true, probe: false };
        let second: Promise<unknown> | null = null;
        let started: () => void;
        const streaming = new Promise<void>((resolve) => started = resolve);
        // The second request is sent once the first is streaming, so it finds the one
        // sequence taken (counted in events, not timed).
        const first = run(client, prefill, small, PROMPTS[0], {
          ...colocated,
          generateTokens: 600,
          onText: () => {
            second ??= run(client, prefill, small, PROMPTS[1], colocated);
            started();
          },
        });
        await streaming;
        await assert.rejects(second!, /busy/);
        const r = await first;
        assert.equal(r.tokens.length, 600);
        const stats = await small.stats();
        assert.equal(stats.refusedBusyTotal, 1);
      });

      await t.step("--batching off: a context per session, said in the stats", async () => {
        const off = await startInProcess("off", "decode", `${dir}/off`, model, {
          batching: "off",
        });
        try {
          assert.ok(!(off.worker!.sessions instanceof SequencePool));
          const r = await run(client, prefill, off, PROMPTS[0]);
          assert.deepEqual(r.logitsSha256, alone[0].logitsSha256);
          const stats = await off.stats();
          assert.equal(stats.decodePath, "per-session");
          assert.equal(stats.sequencesMax, undefined);
        } finally {
          await off.stop();
        }
      });

      await waitForIdle(decode, HANG_MS);
      await waitForIdle(small, HANG_MS);
      const stats = await decode.stats();
      assert.equal(stats.decodePath, "batched");
      assert.equal(stats.sequencesMax, 4);
      assert.equal(stats.sequencesBusy, 0);
      assert.equal(stats.kvCellsUsed, 0);
      assert.equal(stats.kvCellsMax, 4 * 2048);
      assert.ok((stats.rssBytes ?? 0) > 0);
    } finally {
      await Promise.allSettled([prefill.stop(), decode.stop(), small.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
