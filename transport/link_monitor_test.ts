import assert from "node:assert/strict";
import { makeTestNodes } from "./_conformance.ts";
import { LinkMonitor } from "./link_monitor.ts";
import { fakeLoopbackPeers } from "./loopback.ts";

Deno.test("LinkMonitor.measure() leaves a fresh RTT and bandwidth estimate for the pair", async () => {
  const nodes = await makeTestNodes();
  const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server);
  try {
    const m = new LinkMonitor("me", undefined, { pingsPerMeasure: 3 });
    const e = await m.measure(client, 2 * 1024 * 1024);
    assert.ok(e, "an estimate");
    assert.equal(e.pair.to, client.peerNodeId);
    assert.equal(e.rttSamples, 3);
    assert.equal(e.bandwidthSamples, 1);
    assert.equal(e.bandwidthSource, "probe");
    assert.equal(e.lossFraction, 0);
    assert.equal(e.lossSource, "pings"); // no datagrams on this fake link: no loss probe
    // A second measure finds the bulk sample recent: no second probe.
    const again = await m.measure(client);
    assert.equal(again!.bandwidthSamples, 1);
    // A handoff's own transfer is a sample too.
    assert.equal(m.recordTransfer(client.peerNodeId, 8 * 1024 * 1024, 10), true);
    assert.equal(m.estimate(m.pairTo(client))!.bandwidthSource, "handoff");
  } finally {
    link.drop();
  }
});

Deno.test("LinkMonitor.watch() pings until stopped", async () => {
  const nodes = await makeTestNodes();
  const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server);
  try {
    const m = new LinkMonitor("me", undefined, { pingIntervalMs: 1 });
    const stop = m.watch(client);
    for (let k = 0; k < 1000 && (m.estimate(m.pairTo(client))?.rttSamples ?? 0) < 3; k++) {
      await new Promise((r) => setTimeout(r, 5));
    }
    stop();
    const n = m.estimate(m.pairTo(client))!.rttSamples;
    assert.ok(n >= 3);
    await new Promise((r) => setTimeout(r, 30));
    assert.ok(m.estimate(m.pairTo(client))!.rttSamples <= n + 1, "stopped (one in flight at most)");
  } finally {
    link.drop();
  }
});

Deno.test("LinkMonitor.measure() probes loss with datagrams where the link has them, once per lossProbeAgeMsMax", async () => {
  const nodes = await makeTestNodes();
  // FAKE link losing every 500th datagram: 0.2%, which no ping shows.
  const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server, {
    datagrams: { dropEvery: 500 },
  });
  try {
    const m = new LinkMonitor("me", undefined, { pingsPerMeasure: 3, lossProbeDatagrams: 4000 });
    const e = await m.measure(client, 2 * 1024 * 1024);
    assert.equal(e!.lossSource, "datagrams");
    assert.equal(e!.lossSamples, 4000);
    assert.ok(Math.abs(e!.lossFraction! - 0.002) < 1e-12, `${e!.lossFraction}`);
    const again = await m.measure(client);
    assert.equal(again!.lossSamples, 4000, "a recent loss probe: no second one");
    assert.equal(await m.probeLoss(client), null);
  } finally {
    link.drop();
  }
});
