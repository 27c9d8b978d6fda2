/**
 * Admission's queue rules against a counting pool (a fake of the session pool, named as such:
 * no llama.cpp is involved in who waits and who is refused). Order and refusals are asserted
 * by events; the only timer is `queueWaitMs` itself, the bound under test.
 */
import assert from "node:assert/strict";
import { Admission } from "./admission.ts";
import type { PooledSession, SessionPool } from "./pool.ts";

/** A pool fake: `capacity` tokens; release frees one on the next turn (as a wipe would). */
class FakePool implements SessionPool {
  readonly path = "batched";
  whenFree: (() => void) | null = null;
  busy = 0;
  constructor(readonly capacity: number) {}
  tryAcquire(): Promise<PooledSession | null> {
    if (this.busy >= this.capacity) return Promise.resolve(null);
    this.busy++;
    return Promise.resolve({ engine: {} as PooledSession["engine"], draft: null });
  }
  release(): void {
    setTimeout(() => {
      this.busy--;
      this.whenFree?.();
    }, 0);
  }
}

Deno.test("admission: waiters are served in order as sessions free, beyond the depth refused", async () => {
  const pool = new FakePool(1);
  const admission = new Admission(pool, { queueDepthMax: 2, queueWaitMs: 600_000 });
  const first = await admission.acquire();
  assert.ok(first.ok);
  const order: string[] = [];
  const a = admission.acquire().then((r) => (order.push("a"), r));
  const b = admission.acquire().then((r) => (order.push("b"), r));
  const c = await admission.acquire(); // queue full
  assert.ok(!c.ok);
  assert.match(c.busy, /busy: all 1 sessions in use and 2 requests waiting/);
  // A reservation never waits, and never overtakes the waiters.
  const now = await admission.acquireNow();
  assert.ok(!now.ok);
  assert.equal(admission.counters.admissionWaiting, 2);
  admission.release(first.session);
  const ra = await a;
  assert.ok(ra.ok);
  admission.release(ra.session);
  const rb = await b;
  assert.ok(rb.ok);
  assert.deepEqual(order, ["a", "b"]);
  admission.release(rb.session);
  assert.deepEqual(admission.counters, {
    admissionWaiting: 0,
    admittedTotal: 3,
    queuedTotal: 2,
    refusedBusyTotal: 2,
  });
});

Deno.test("admission: a waiter is refused busy after queueWaitMs; close refuses the rest", async () => {
  const pool = new FakePool(1);
  const admission = new Admission(pool, { queueDepthMax: 4, queueWaitMs: 1 });
  const held = await admission.acquire();
  assert.ok(held.ok);
  const late = await admission.acquire();
  assert.ok(!late.ok);
  assert.match(late.busy, /stayed in use for 1 ms/);
  const patient = new Admission(new FakePool(0), { queueDepthMax: 4, queueWaitMs: 600_000 });
  const waiting = patient.acquire();
  patient.close();
  assert.ok(!(await waiting).ok);
});

Deno.test("admission: out-of-range options are refused with the option's name", () => {
  assert.throws(
    () => new Admission(new FakePool(1), { queueDepthMax: -1, queueWaitMs: 0 }),
    /queueDepthMax/,
  );
  assert.throws(
    () => new Admission(new FakePool(1), { queueDepthMax: 1, queueWaitMs: 1.5 }),
    /queueWaitMs/,
  );
});
