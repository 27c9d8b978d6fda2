/**
 * The prefix cache across tenants (issue #12): another tenant sending a prefix that is cached
 * for someone else gets no hit, and cannot tell from what comes back that it was cached. Real
 * workers in this process over real QUIC, the tiny hybrid model.
 *
 * Timings are never compared (they depend on the machine); what is compared is the work the
 * request does and everything it is told: tenant B's request while tenant A's checkpoints of
 * the same prompt are cached, against tenant C's identical request on an emptied cache. Both
 * compute every token, take the same checkpoints (same entries and bytes added), send the
 * same components and bytes, and get the same tokens and probe digests; so their timings
 * come from the same work. The worker's stats carry no hit count at all, and a lookup costs
 * the same on an empty index (no shortcut): a tenant's request cannot observe another's hits.
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
import { runHandoff } from "./coordinator.ts";

Deno.test({
  name:
    "prefix cache: another tenant's identical prefix gets no hit and does the same work as on an empty cache",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
    const model = await testModel("hybrid");
    const workers: TestWorker[] = [];
    try {
      const [decode, prefill] = await Promise.all([
        startInProcess("decode", "decode", `${dir}/decode`, model, { sessionsMax: 2 }),
        startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
          prefixCache: {
            prefixCacheBytesMax: 256 * 1024 * 1024,
            prefixBlockTokens: 32,
            prefixCheckpointsMax: 4,
          },
        }),
      ]);
      workers.push(decode, prefill);
      const cache = prefill.worker!.prefill!.prefixCache;
      const client = nodes.get("client")!;
      const prompt = "a shared system prompt that every tenant sends first. ".repeat(8);
      const run = (tenantId: string) =>
        runHandoff(client, {
          prefill: prefill.peer,
          decode: decode.peer,
          prompt,
          generateTokens: 6,
          sampling: SAMPLING,
          tenantId,
          probe: true,
          timeoutMs: HANG_MS,
        });
      const observed = async (tenantId: string) => {
        const before = cache.counters;
        const r = await run(tenantId);
        assert.equal(r.placement, "disaggregated", r.fallbackReason ?? "");
        const after = cache.counters;
        const t = r.telemetry;
        return {
          cachedTokens: t.cachedTokens,
          computedTokens: t.computedTokens,
          promptTokens: t.promptTokens,
          bytesByComponent: t.bytesByComponent,
          totalBytes: t.totalBytes,
          retries: t.retries,
          fallbacks: r.fallbacks,
          tokens: r.tokens,
          digests: r.logitsSha256,
          entriesAdded: after.prefixCacheEntries - before.prefixCacheEntries,
          bytesAdded: after.prefixCacheBytes - before.prefixCacheBytes,
        };
      };

      const a1 = await observed("tenant-a"); // fills the cache for tenant A
      assert.equal(a1.cachedTokens, 0);
      assert.ok(a1.entriesAdded > 0);
      const a2 = await run("tenant-a"); // A's own repeat hits: the cache works here
      assert.ok(a2.telemetry.cachedTokens > 0);

      const b = await observed("tenant-b"); // A's checkpoints of this very prompt are cached
      cache.clear();
      assert.equal(cache.counters.prefixCacheEntries, 0);
      const c = await observed("tenant-c"); // nothing cached at all
      assert.equal(b.cachedTokens, 0);
      assert.equal(b.computedTokens, b.promptTokens);
      assert.deepEqual(b, c);

      // Nothing in the worker's stats counts hits (only bytes and entries held, all tenants).
      const stats = await prefill.stats();
      const names = Object.keys(stats).join(" ");
      assert.doesNotMatch(names, /hit|cached|prefix/i);
    } finally {
      await Promise.allSettled(workers.map((w) => w.stop()));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
