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
    assert.ok(r.bandwidthBytesPerS > 0 && r.receiveMs > 0 && r.elapsedMs > 0);
    // The rate is the counted bytes over the receiver's time for them. (receiveMs comes from a
    // fitted arrival slope, so on a loaded machine it may exceed the sender's elapsed time.)
    assert.ok(Math.abs(r.bandwidthBytesPerS - (r.bytes / r.receiveMs) * 1000) < 1e-6);
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

Deno.test("ArrivalRate: a backlog at the start or bursts after losses do not inflate the rate", () => {
  // 12.5 bytes/us (100 Mbit/s) in 16 KiB frames.
  const frame = 16_384, perMs = 12_500, total = 1_800_000;
  const run = (arrival: (bytes: number) => number) => {
    const r = new ArrivalRate(total);
    for (let bytes = frame; bytes <= total; bytes += frame) r.add(arrival(bytes), bytes);
    return { fitted: total / r.receiveMs(total)!, naive: total / arrival(total) };
  };
  const near = (x: number) => Math.abs(x / perMs - 1) < 0.05;
  // The reader was 300 KB behind when the clock started: those bytes arrive at once.
  const backlog = run((b) => Math.max(0, b - 300_000) / perMs);
  assert.ok(backlog.naive > perMs * 1.15, `naive ${backlog.naive}`);
  assert.ok(near(backlog.fitted), `fitted ${backlog.fitted}`);
  // Drops throughout: every 150 KB is held behind a lost packet until the next 150 KB
  // boundary, then released at once (head-of-line blocking; the link itself never idles).
  const hol = run((b) => Math.ceil(b / 150_000) * 150_000 / perMs);
  assert.ok(near(hol.fitted), `fitted ${hol.fitted}`);
});

Deno.test("ArrivalRate: too few frames after the first quarter, or all at once, give no rate", () => {
  const r = new ArrivalRate(1000);
  for (let k = 0; k <= 5; k++) r.add(k, k * 100); // 300, 400, 500 count: 3 frames
  assert.equal(r.receiveMs(500), null);
  r.add(6, 600);
  assert.equal(r.receiveMs(1000), 10); // 100 bytes per ms
  const flat = new ArrivalRate(1000);
  for (let k = 3; k <= 10; k++) flat.add(5, k * 100);
  assert.equal(flat.receiveMs(1000), null);
});
