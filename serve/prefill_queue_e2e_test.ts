/**
 * Queued prefill end to end (issue #9), on real workers in this process over real QUIC with
 * the tiny hybrid model: a prefill worker with N = 2 contexts and a queue of k = 2. Two
 * requests hold its contexts (a test hook keeps them there, so which request waits never
 * depends on the machine's speed), two more wait in the queue, and the fifth is answered
 * `busy` and recomputed colocated on the decoder. Every request's tokens equal the colocated
 * run of its prompt. While queued, Progress keeps the coordinator's idle timeout from firing
 * (the queued requests' timeout is shorter than their wait). A cancel from another tenant is
 * ignored. Compute is never timed (HANG_MS watchdogs only).
 */
import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import {
  HANG_MS,
  makeNodes,
  promptOf,
  RELEASE_BOUND_MS,
  SAMPLING,
  SCHEDULING_SLACK_MS,
  sleep,
  startInProcess,
  type TestWorker,
  waitForIdle,
  waitForStats,
} from "./_failure_harness.ts";
import { type HandoffRequest, type HandoffResult, runHandoff } from "./coordinator.ts";
import { PROGRESS_INTERVAL_MS } from "./messages.ts";
import { queryStats } from "./stats.ts";

const PROMPTS = [promptOf(6), promptOf(9)];
/** The queued requests' idle timeout: one Progress interval plus scheduling slack. */
const QUEUED_TIMEOUT_MS = PROGRESS_INTERVAL_MS + SCHEDULING_SLACK_MS;
/** How long the queued requests are kept waiting: past their idle timeout by one interval. */
const QUEUED_WAIT_MS = QUEUED_TIMEOUT_MS + PROGRESS_INTERVAL_MS;

Deno.test({
  name:
    "prefill queue: N run, k wait and complete, one more is busy and runs colocated, equal tokens",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
    const model = await testModel("hybrid");
    const workers: TestWorker[] = [];
    let open!: () => void;
    const gate = new Promise<void>((resolve) => open = resolve);
    try {
      const [decode, prefill] = await Promise.all([
        startInProcess("decode", "decode", `${dir}/decode`, model, { sessionsMax: 4 }),
        startInProcess("prefill", "prefill", `${dir}/prefill`, model, {
          sessionsMax: 2,
          prefillQueue: { prefillQueueDepthMax: 2, prefillQueueWaitMs: HANG_MS },
          prefillHooks: { admitted: (id) => id.startsWith("held") ? gate : Promise.resolve() },
        }),
      ]);
      workers.push(decode, prefill);
      const client = nodes.get("client")!;
      const run = (handoffId: string, i: number, over: Partial<HandoffRequest> = {}) =>
        runHandoff(client, {
          prefill: prefill.peer,
          decode: decode.peer,
          prompt: PROMPTS[i % 2],
          generateTokens: 6,
          sampling: SAMPLING,
          tenantId: "tenant-a",
          probe: false,
          timeoutMs: HANG_MS,
          handoffId,
          ...over,
        });
      const colocated: HandoffResult[] = [];
      for (const [i] of PROMPTS.entries()) {
        colocated.push(await run(`base-${i}`, i, { colocated: true }));
      }

      const held = [run("held-0", 0), run("held-1", 1)];
      // Their failures surface at the Promise.all below, not as unhandled rejections.
      held.forEach((p) => p.catch(() => {}));
      await waitForStats(prefill, (s) => s.prefillActive === 2, HANG_MS, "two requests running");
      const queued = [2, 3].map((i) => run(`queued-${i}`, i, { timeoutMs: QUEUED_TIMEOUT_MS }));
      queued.forEach((p) => p.catch(() => {}));
      await waitForStats(prefill, (s) => s.prefillQueued === 2, HANG_MS, "two requests queued");

      // Another tenant cannot cancel a queued request; the StatsRequest after the cancel on the
      // same connection is answered after the cancel was handled.
      const conn = await client.connect(prefill.peer);
      await conn.send({ type: "CancelRequest", handoffId: "queued-2", tenantId: "tenant-b" });
      assert.equal((await queryStats(conn)).prefillQueued, 2, "the cancel was ignored");
      await conn.close();

      const busy = await run("busy-4", 4);
      assert.equal(busy.placement, "colocated");
      assert.match(
        busy.fallbackReason!,
        /^prefill-busy: .*queue is full \(prefillQueueDepthMax 2\)/,
      );
      assert.deepEqual(busy.tokens, colocated[0].tokens);
      assert.equal((await prefill.stats()).prefillBusyTotal, 1);

      // Longer than the queued requests' idle timeout: only their Progress keeps them alive.
      await sleep(QUEUED_WAIT_MS);
      assert.equal((await prefill.stats()).prefillQueued, 2, "still waiting, not timed out");
      open();
      const results = await Promise.all([...held, ...queued]);
      results.forEach((r, i) => {
        assert.equal(r.placement, "disaggregated", `request ${i}: ${r.fallbackReason}`);
        assert.deepEqual(r.tokens, colocated[i % 2].tokens, `request ${i}`);
      });
      const s = await prefill.stats();
      assert.equal(s.prefillQueuedTotal, 2);
      assert.ok(s.prefillQueueWaitMsMax >= QUEUED_WAIT_MS, String(s.prefillQueueWaitMsMax));
      for (const w of workers) await waitForIdle(w, RELEASE_BOUND_MS);
    } finally {
      open?.();
      await Promise.allSettled(workers.map((w) => w.stop()));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
