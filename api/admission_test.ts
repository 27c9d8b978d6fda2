import assert from "node:assert/strict";
import { Admission } from "./admission.ts";
import { ApiError } from "./errors.ts";

Deno.test("Admission runs requestsInFlightMax at once, queues the next, refuses past queueDepthMax", async () => {
  const a = new Admission({ requestsInFlightMax: 1, queueDepthMax: 1, queueWaitMs: 600_000 });
  const first = await a.acquire();
  const second = a.acquire();
  assert.equal(a.running, 1);
  assert.equal(a.waiting, 1);
  await assert.rejects(a.acquire(), (e: unknown) => {
    assert.ok(e instanceof ApiError);
    assert.equal(e.status, 503);
    assert.equal(e.options.retryAfterS, 1);
    assert.match(e.message, /queueDepthMax 1/);
    return true;
  });
  first.release();
  first.release(); // a second release is a no-op
  const got = await second;
  assert.equal(a.running, 1);
  assert.equal(a.waiting, 0);
  got.release();
  assert.equal(a.running, 0);
});

Deno.test("Admission refuses a waiter after queueWaitMs, and drops one whose client left", async () => {
  const a = new Admission({ requestsInFlightMax: 1, queueDepthMax: 4, queueWaitMs: 1 });
  const held = await a.acquire();
  await assert.rejects(a.acquire(), /no slot within queueWaitMs 1/);
  const gone = new AbortController();
  const slow = new Admission({ requestsInFlightMax: 1, queueDepthMax: 4, queueWaitMs: 600_000 });
  const heldSlow = await slow.acquire();
  const waiting = slow.acquire(gone.signal);
  assert.equal(slow.waiting, 1);
  gone.abort();
  await assert.rejects(waiting, /went away/);
  assert.equal(slow.waiting, 0);
  heldSlow.release();
  held.release();
  assert.equal(slow.running + a.running, 0);
});

Deno.test("Admission takes no slot and no place in the queue for a client already gone", async () => {
  const a = new Admission({ requestsInFlightMax: 1, queueDepthMax: 4, queueWaitMs: 600_000 });
  const gone = new AbortController();
  gone.abort();
  await assert.rejects(a.acquire(gone.signal), /went away/);
  assert.equal(a.running, 0);
  const held = await a.acquire();
  await assert.rejects(a.acquire(gone.signal), /went away/);
  assert.equal(a.waiting, 0);
  held.release();
  assert.equal(a.running, 0);
});
