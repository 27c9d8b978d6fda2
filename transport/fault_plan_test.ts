import { assert, assertEquals } from "../testing/assert.ts";
import { makeTestNodes } from "./_conformance.ts";
import { encodeFrame } from "./frame.ts";
import { randomFaultPlan } from "./fault_plan.ts";
import { fakeLoopbackPeers } from "./loopback.ts";

Deno.test("randomFaultPlan() gives the same plan for the same seed and varies across seeds", () => {
  assertEquals(
    randomFaultPlan(5, { streamBytes: 10_000 }),
    randomFaultPlan(5, { streamBytes: 10_000 }),
  );
  const kinds = new Set(
    Array.from(
      { length: 40 },
      (_, seed) => Object.keys(randomFaultPlan(seed, { streamBytes: 1000 })).sort().join(),
    ),
  );
  assert(kinds.size >= 4, `only ${kinds.size} fault kinds drawn`);
});

Deno.test("duplicateFrameIndex delivers that frame twice (sequence checks above transport must catch it)", async () => {
  const nodes = await makeTestNodes();
  const { client, server, link } = await fakeLoopbackPeers(nodes.client, nodes.server, {
    faults: { duplicateFrameIndex: 2 }, // frame 0 is HandoffStreamOpen
  });
  try {
    const sender = await client.openHandoffStream({ handoffId: "dup" });
    const sending = (async () => {
      for (let seq = 0; seq < 3; seq++) {
        await sender.send({ type: "StateChunk", seq }, new Uint8Array(100));
      }
      await sender.finish();
    })();
    sending.catch(() => {});
    const receiver = (await server.acceptHandoffStream())!.accept();
    const seqs = [];
    for (let i = 0; i < 4; i++) seqs.push((await receiver.receive())?.header.seq);
    assertEquals(seqs, [0, 1, 1, 2]);
  } finally {
    link.drop();
  }
});

Deno.test("killPeerAfterBytes silences the sender mid-stream; the survivor times out", async () => {
  const nodes = await makeTestNodes();
  const open = encodeFrame({ type: "HandoffStreamOpen", meta: {} }).wireBytes;
  const { client, server, link } = await fakeLoopbackPeers(nodes.client, nodes.server, {
    faults: { killPeerAfterBytes: open + 50 },
    maxIdleTimeoutMs: 300,
  });
  try {
    const sender = await client.openHandoffStream({});
    sender.send({ type: "StateChunk", seq: 0 }, new Uint8Array(1000)).catch(() => {});
    const receiver = (await server.acceptHandoffStream())!.accept();
    const started = performance.now();
    const error = await receiver.receive().then(() => null, (e) => e);
    assert(error !== null, "the survivor must see an error");
    assert((await server.closed).timedOut);
    assert(performance.now() - started < 1300);
  } finally {
    link.drop();
  }
});
