import { assert, assertEquals, assertRejects, assertThrows } from "../testing/assert.ts";
import { LimitExceededError, ProtocolError } from "../core/errors.ts";
import { randomInt, seededRandom } from "./_prng.ts";
import { CreditReceiver, CreditSender } from "./credit.ts";

Deno.test("CreditSender waits for a grant and never exceeds the cumulative total", async () => {
  const sender = new CreditSender();
  let sent = false;
  const pending = sender.acquire(100).then(() => sent = true);
  await Promise.resolve();
  assert(!sent, "no credit yet");
  sender.grant(2000);
  await pending;
  await sender.acquire(900);
  assertEquals(sender.sentBytesTotal, 1000);
  const blocked = sender.acquire(1000);
  sender.grant(2000); // a repeated total changes nothing
  sender.grant(2001);
  await blocked;
  assertEquals(sender.sentBytesTotal, 2000);
});

Deno.test("CreditSender rejects frames over half the window, backwards grants, and fails waiters", async () => {
  const sender = new CreditSender();
  sender.grant(1000);
  await assertRejects(
    () => sender.acquire(501),
    LimitExceededError,
    "half the peer's credit window",
  );
  assertThrows(() => sender.grant(999), ProtocolError, "invalid transfer credit");
  await sender.acquire(500);
  await sender.acquire(500);
  const waiting = sender.acquire(10);
  sender.fail(new Error("gone"));
  await assertRejects(() => waiting, Error, "gone");
});

Deno.test("CreditReceiver grants in steps, not per frame, and refuses an overrun", () => {
  const receiver = new CreditReceiver({ inflightBytesMax: 1000 });
  assertEquals(receiver.initialGrant(), 1000);
  receiver.onReceived(100);
  assertEquals(receiver.release(100), null, "a 100-byte top-up is below the 250-byte step");
  receiver.onReceived(200);
  assertEquals(receiver.release(200), 1300);
  receiver.onReceived(700);
  assertThrows(() => receiver.onReceived(301), ProtocolError, "overran its transfer credit");
});

Deno.test("sender and receiver never deadlock for any frame size up to half the window (seeded)", async () => {
  const random = seededRandom(3);
  for (let round = 0; round < 200; round++) {
    const window = randomInt(random, 8, 4096);
    const receiver = new CreditReceiver({ inflightBytesMax: window });
    const sender = new CreditSender();
    sender.grant(receiver.initialGrant());
    for (let frame = 0; frame < 50; frame++) {
      const bytes = randomInt(random, 0, Math.floor(window / 2));
      const acquired = sender.acquire(bytes);
      // The receiver releases everything it got; any grant goes straight back to the sender.
      let settled = false;
      acquired.then(() => settled = true);
      await Promise.resolve();
      if (!settled) {
        const grant = receiver.release(receiver.stagedBytes);
        if (grant !== null) sender.grant(grant);
        await Promise.resolve();
      }
      assert(settled, `round ${round} frame ${frame}: deadlock (window ${window}, frame ${bytes})`);
      receiver.onReceived(bytes);
      assert(sender.sentBytesTotal <= sender.grantedBytesTotal);
    }
  }
});
