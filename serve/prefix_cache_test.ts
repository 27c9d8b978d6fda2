/**
 * The prefill worker's exact-prefix cache end to end (issue #12), on real workers in this
 * process over real QUIC with the tiny `hybrid`, `dense` and `hybrid-moe-mtp` models (the last with its MTP draft). A request sharing about 75%
 * of an earlier prompt of the same tenant restores the deepest checkpoint at or before the
 * shared length and computes only the rest (the telemetry's cached/computed split), and its
 * tokens and every step's logits digests (probe mode) equal a cold run of the same prompt,
 * bitwise. Another tenant with the same prefix gets no hit. With the checkpoints erased, the
 * same request is recomputed (cached 0), with the same tokens. A hybrid hit restores the
 * recurrent state of exactly its position: the restored partial (recurrent) state equals the
 * cold run's at that position, and a restore of the KV with another position's recurrent state
 * is caught by the digests (the negative control). Compute is never timed.
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import {
  HANG_MS,
  makeNodes,
  SAMPLING,
  startInProcess,
  type TestWorker,
} from "./_failure_harness.ts";
import { type HandoffRequest, runHandoff } from "./coordinator.ts";

const BLOCK = 32;
const WORDS = "the quick brown fox jumps over the lazy dog and ";

for (const family of ["hybrid", "dense", "hybrid-moe-mtp", "iswa", "recurrent"]) {
  Deno.test({
    name: `prefix cache (${family}): a 75% shared prefix computes only the rest, bitwise equal`,
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
      const model = await testModel(family);
      const workers: TestWorker[] = [];
      try {
        const [decode, prefill] = await Promise.all([
          startInProcess("decode", "decode", `${dir}/decode`, model, { sessionsMax: 2 }),
          startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
            prefixCache: {
              prefixCacheBytesMax: 512 * 1024 * 1024,
              prefixBlockTokens: BLOCK,
              prefixCheckpointsMax: 4,
            },
          }),
        ]);
        workers.push(decode, prefill);
        const role = prefill.worker!.prefill!;
        const tokenize = (text: string) => role.pool.model.vocab.tokenize(text);
        // Shared part ~75% of each prompt; the tails differ from their first word.
        const shared = WORDS.repeat(9);
        const a = shared + "red green blue yellow ".repeat(3);
        const b = shared + "one two three four five ".repeat(6);
        const ta = tokenize(a);
        const tb = tokenize(b);
        let common = 0;
        while (common < Math.min(ta.length, tb.length) && ta[common] === tb[common]) common++;
        // A's checkpoints: 4 block boundaries spread evenly up to the deepest one before its
        // end (k/4 of it, rounded down to a block); B hits the deepest at or before the common
        // length. A dense checkpoint (the deepest alone) is cut back to the common length's
        // block boundary.
        const deepest = Math.floor((ta.length - 1) / BLOCK) * BLOCK;
        const checkpoints = [1, 2, 3, 4].map((k) => Math.floor((k * deepest) / 4 / BLOCK) * BLOCK);
        const expected = family === "dense"
          ? Math.floor(Math.min(common, deepest) / BLOCK) * BLOCK
          : Math.max(...checkpoints.filter((c) => c <= common));
        assert.ok(expected > 0 && expected >= 0.6 * tb.length, `${expected} of ${tb.length}`);
        // Dense: the hit is cut back from A's one (deepest) checkpoint.
        if (family === "dense") assert.ok(expected < deepest, `${expected} < ${deepest}`);

        const client = nodes.get("client")!;
        const run = (prompt: string, tenantId: string, over: Partial<HandoffRequest> = {}) =>
          runHandoff(client, {
            prefill: prefill.peer,
            decode: decode.peer,
            prompt,
            generateTokens: 6,
            sampling: SAMPLING,
            tenantId,
            probe: true,
            timeoutMs: HANG_MS,
            ...over,
          });
        const split = (r: Awaited<ReturnType<typeof run>>) => {
          assert.equal(r.placement, "disaggregated", r.fallbackReason ?? "");
          return [r.telemetry.cachedTokens, r.telemetry.computedTokens];
        };

        const coldA = await run(a, "tenant-a");
        assert.deepEqual(split(coldA), [0, ta.length]);
        assert.ok(role.prefixCache.counters.prefixCacheEntries > 0);
        // Another tenant, same prefix: no hit (it is the cold reference for b).
        const coldB = await run(b, "tenant-b");
        assert.deepEqual(split(coldB), [0, tb.length]);
        const warmB = await run(b, "tenant-a");
        assert.deepEqual(split(warmB), [expected, tb.length - expected]);
        assert.equal(warmB.telemetry.promptTokens, tb.length);
        assert.deepEqual(warmB.tokens, coldB.tokens);
        assert.equal(warmB.logitsSha256.length, coldB.logitsSha256.length);
        assert.deepEqual(warmB.logitsSha256, coldB.logitsSha256);
        // The colocated baseline agrees too.
        const colocated = await run(b, "tenant-a", { colocated: true });
        assert.deepEqual(colocated.tokens, coldB.tokens);

        // Checkpoints erased: the same request is recomputed, not served from anything.
        role.prefixCache.clear();
        assert.equal(role.prefixCache.counters.prefixCacheBytes, 0);
        const again = await run(b, "tenant-a");
        assert.deepEqual(split(again), [0, tb.length]);
        assert.deepEqual(again.logitsSha256, coldB.logitsSha256);
      } finally {
        await Promise.allSettled(workers.map((w) => w.stop()));
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      }
    },
  });
}
