import assert from "node:assert/strict";
import { PeerError } from "../core/errors.ts";
import { makeTestNodes } from "./_conformance.ts";
import {
  ArrivalRate,
  DEFAULT_LINK_PROBE_OPTIONS,
  PingAnswerBudget,
  PingTracker,
} from "./link_probe.ts";
import { fakeLoopbackPeers } from "./loopback.ts";

async function pair(serverProbe = {}) {
  const nodes = await makeTestNodes();
  return await fakeLoopbackPeers(nodes.client, { ...nodes.server, linkProbe: serverProbe });
}

Deno.test("ping() measures a control-stream round trip that the application never sees", async () => {
  const { client, server, link } = await pair();
  try {
    assert.equal(client.supportsLinkProbe, true);
    const rtts = [await client.ping(), await server.ping(), await client.ping()];
    for (const r of rtts) assert.ok(r !== null && r >= 0, `rtt ${r}`);
    await client.send({ type: "AppMessage", n: 1 });
    const got = await server.receive();
    assert.equal(got?.header.type, "AppMessage", "pings and pongs stay inside the transport");
    // One in flight: concurrent callers share the same ping.
    const [a, b] = [client.ping(), client.ping()];
    assert.equal(await a, await b);
    await assert.rejects(() => client.send({ type: "LinkPing", seq: 1 }), /reserved/);
  } finally {
    link.drop();
  }
});

Deno.test("PingTracker: an unanswered ping counts as lost after pingTimeoutMs", async () => {
  const sent: number[] = [];
  const t = new PingTracker(
    (h) => Promise.resolve(sent.push(h.seq)),
    { ...DEFAULT_LINK_PROBE_OPTIONS, pingTimeoutMs: 20, pingIntervalMsMin: 1 },
  );
  assert.equal(await t.ping(), null);
  const second = t.ping();
  await new Promise((r) => setTimeout(r, 5));
  t.onPong({ seq: 999 }); // stale: ignored
  t.onPong({ seq: sent[sent.length - 1] });
  const rtt = await second;
  assert.ok(rtt !== null && rtt >= 0);
  assert.deepEqual(sent, [1, 2]);
});

Deno.test("PingAnswerBudget answers at most its rate and counts the rest", () => {
  const b = new PingAnswerBudget(3, 0);
  const answered = [0, 0, 0, 0, 0].filter(() => b.take(0)).length;
  assert.equal(answered, 3);
  assert.equal(b.dropped, 2);
  assert.equal(b.take(1000), true, "refilled after a second");
});

Deno.test("probeBandwidth() counts the second half's bytes (after slow start) and reports a rate", async () => {
  const { client, link } = await pair();
  try {
    const r = await client.probeBandwidth(4 * 1024 * 1024);
    // The frame completing the first 2 MiB starts the clock; the 2 MiB after it are counted.
    assert.equal(r.bytes, 2 * 1024 * 1024);
    assert.ok(r.bandwidthBytesPerS > 0 && r.receiveMs > 0);
    assert.ok(r.elapsedMs >= r.receiveMs);
  } finally {
    link.drop();
  }
});

Deno.test("probeBandwidth() is bounded on both ends: oversize is refused before and by the peer", async () => {
  const { client, link } = await pair({ probeBytesMax: 1024 * 1024 });
  try {
    await assert.rejects(() => client.probeBandwidth(1 << 30), PeerError);
    await assert.rejects(
      () => client.probeBandwidth(2 * 1024 * 1024),
      /refused by the peer: probe size over probeBytesMax/,
    );
    // The connection carries on.
    assert.ok((await client.ping()) !== null);
  } finally {
    link.drop();
  }
});

Deno.test("ArrivalRate: a backlog read at once at the start does not inflate the rate", () => {
  // 12.5 bytes/us (100 Mbit/s) in 16 KiB frames; the reader was 300 KB behind when the clock
  // started, so the first 19 frames come out of the receive buffer at once.
  const frame = 16_384, perMs = 12_500;
  const r = new ArrivalRate(1_800_000);
  let bytes = 0;
  r.add(0, 0);
  for (let k = 0; k < 19; k++) r.add(0.01 * (k + 1), bytes += frame);
  const backlog = bytes;
  while (bytes < 1_800_000) {
    bytes += frame;
    r.add((bytes - backlog) / perMs, bytes);
  }
  const elapsedMs = (bytes - backlog) / perMs;
  const naive = bytes / elapsedMs; // what bytes over elapsed time says
  assert.ok(naive > perMs * 1.15, `naive ${naive}`);
  const fitted = bytes / r.receiveMs(bytes)!;
  assert.ok(Math.abs(fitted / perMs - 1) < 0.05, `fitted ${fitted}`);
});

Deno.test("ArrivalRate: too little after the first quarter or no time passing gives no rate", () => {
  const r = new ArrivalRate(1000);
  for (let k = 0; k <= 6; k++) r.add(k, k * 100); // 250 to 600: under half after the quarter
  assert.equal(r.receiveMs(600), null);
  r.add(8, 800);
  assert.equal(r.receiveMs(800), (800 * 5) / 500); // from (3 ms, 300) to (8 ms, 800)
  const flat = new ArrivalRate(1000);
  for (let k = 0; k <= 10; k++) flat.add(5, k * 100);
  assert.equal(flat.receiveMs(1000), null);
});
