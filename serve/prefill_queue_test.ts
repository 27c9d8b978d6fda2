/**
 * The prefill queue against a fake pool of slots (a counter, named as such): FIFO admission,
 * the depth bound answered at once, the wait bound, cancellation, and the totals for stats.
 * Nothing here computes; the only timers are the queue's own wait bound and retry tick.
 */
import assert from "node:assert/strict";
import { type Admission, PrefillQueue } from "./prefill_queue.ts";

/** FAKE pool: `free` slots, numbered as they are taken. */
function fakePool(free: number) {
  let next = 0;
  const pool = {
    free,
    acquire: () => Promise.resolve(pool.free > 0 ? (pool.free--, next++) : null),
    release: (_slot: number) => void pool.free++,
  };
  return pool;
}

/** Settles to the admission, or "pending" if it has not settled after pending work ran. */
async function peek<T>(p: Promise<Admission<T>>): Promise<Admission<T> | "pending"> {
  return await Promise.race([p, new Promise<"pending">((r) => setTimeout(() => r("pending"), 0))]);
}

Deno.test("PrefillQueue: FIFO behind busy slots, busy when full, cancel leaves the queue", async () => {
  const pool = fakePool(1);
  const q = new PrefillQueue(
    { prefillQueueDepthMax: 2, prefillQueueWaitMs: 60_000 },
    pool.acquire,
    pool.release,
  );
  const never = new AbortController().signal;
  const a = await q.admit(never);
  assert.deepEqual(a, { ok: true, slot: 0, waitedMs: 0 });
  const b = q.admit(never);
  const cancelC = new AbortController();
  const c = q.admit(cancelC.signal);
  assert.equal(await peek(b), "pending");
  assert.equal(q.depth, 2);
  const d = await q.admit(never);
  assert.equal(d.ok, false);
  assert.equal(!d.ok && d.why, "queue-full");
  assert.match(!d.ok ? d.message : "", /queue is full \(prefillQueueDepthMax 2\)/);
  // A slot frees: the first waiter takes it, not the second.
  pool.release(0);
  q.wake();
  const gotB = await b;
  assert.ok(gotB.ok && gotB.slot === 1);
  assert.equal(await peek(c), "pending");
  cancelC.abort();
  const gotC = await c;
  assert.equal(!gotC.ok && gotC.why, "cancelled");
  assert.equal(q.depth, 0);
  // A newcomer may not overtake waiters, but with nobody waiting it takes a free slot at once.
  pool.release(1);
  const e = await q.admit(never);
  assert.ok(e.ok);
  assert.deepEqual(
    { ...q.totals, prefillQueueWaitMsTotal: 0, prefillQueueWaitMsMax: 0 },
    {
      prefillQueuedTotal: 2,
      prefillBusyTotal: 1,
      prefillQueueWaitMsTotal: 0,
      prefillQueueWaitMsMax: 0,
    },
  );
});

Deno.test("PrefillQueue: a wait past prefillQueueWaitMs is busy; a slot freed without wake() is found", async () => {
  const pool = fakePool(0);
  const q = new PrefillQueue(
    { prefillQueueDepthMax: 4, prefillQueueWaitMs: 30 },
    pool.acquire,
    pool.release,
  );
  const never = new AbortController().signal;
  const late = await q.admit(never);
  assert.equal(!late.ok && late.why, "wait-exceeded");
  assert.match(!late.ok ? late.message : "", /prefillQueueWaitMs \(30 ms\)/);
  assert.equal(q.totals.prefillBusyTotal, 1);
  // Freed by someone else (the decode side of a prefill+decode worker): the retry tick sees it.
  const q2 = new PrefillQueue(
    { prefillQueueDepthMax: 4, prefillQueueWaitMs: 60_000 },
    pool.acquire,
    pool.release,
  );
  const waiting = q2.admit(never);
  assert.equal(await peek(waiting), "pending");
  pool.free = 1;
  const got = await waiting;
  assert.ok(got.ok);
  assert.equal(q2.depth, 0);
  assert.equal(pool.free, 0);
});
