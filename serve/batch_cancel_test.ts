/**
 * A cancel on the batched decode path (shared context, serve/batch_loop.ts) drops the
 * session's queued work at once, not when its prompt's chunks have run: a colocated request's
 * prefill is held inside a step (the context's decode gated by the test, counted in events,
 * not timed), the client cancels, and the sequence's work leaves the loop's queue while that
 * step is still held; afterwards the worker holds nothing.
 */
import assert from "node:assert/strict";
import {
  HANG_MS,
  hybridTrio,
  promptOf,
  SAMPLING,
  startInProcess,
  waitForIdle,
} from "./_failure_harness.ts";
import { SequencePool } from "./batch_pool.ts";
import { runHandoff } from "./coordinator.ts";

Deno.test({
  name:
    "batched decode: a cancel during a colocated prefill frees the sequence's queued work at once",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { model, dir, client } = await hybridTrio();
    const prefill = await startInProcess("prefill", "prefill", `${dir}/prefill`, model);
    const decode = await startInProcess("decode", "decode", `${dir}/decode`, model, {
      sessionsMax: 2,
    });
    try {
      const pool = decode.worker!.sessions;
      assert.ok(pool instanceof SequencePool, "the decode worker batches by default");
      const ctx = pool.loop.ctx;
      const decodeRows = ctx.decodeRows.bind(ctx);
      let entered: () => void;
      const inStep = new Promise<void>((resolve) => entered = resolve);
      let open: () => void;
      const gate = new Promise<void>((resolve) => open = resolve);
      // Test gate (no fake runtime): the first prompt step waits here until the test opens it.
      ctx.decodeRows = async (batch, rows) => {
        if (batch.length > 1) {
          entered();
          await gate;
        }
        return await decodeRows(batch, rows);
      };
      const cancel = new AbortController();
      const request = runHandoff(client, {
        prefill: prefill.peer,
        decode: decode.peer,
        prompt: promptOf(40),
        generateTokens: 8,
        sampling: SAMPLING,
        tenantId: "tenant-a",
        probe: false,
        timeoutMs: HANG_MS,
        colocated: true,
        signal: cancel.signal,
      });
      const settled = request.then(() => "completed", (e) => String(e));
      await inStep;
      assert.equal(pool.loop.pending, 1, "the prompt is queued in the held step");
      cancel.abort();
      // The CancelRequest reaches the worker; its sequence's work leaves the queue while the
      // step is still held (before the fix it stayed queued until the prompt had run).
      const t0 = performance.now();
      const pending = () => pool.loop.pending;
      while (pending() !== 0) {
        if (performance.now() - t0 > HANG_MS) throw new Error("the cancel never dropped the work");
        await new Promise((r) => setTimeout(r, 10));
      }
      open!();
      assert.match(await settled, /cancel/i);
      await waitForIdle(decode, HANG_MS);
      ctx.decodeRows = decodeRows;
    } finally {
      await Promise.allSettled([prefill.stop(), decode.stop()]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
