import assert from "node:assert/strict";
import { makeTestNodes } from "../transport/test_nodes.ts";
import { fakeLoopbackPeers } from "../transport/loopback.ts";
import { DecoderLinkLoss } from "./link_loss.ts";

Deno.test("DecoderLinkLoss measures a decoder's link after a handoff, once per lossProbeAgeMsMax, and reports it", async () => {
  const nodes = await makeTestNodes();
  // FAKE link losing every 400th datagram (0.25%), which pings cannot see.
  const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server, {
    datagrams: { dropEvery: 400 },
  });
  const lines: string[] = [];
  try {
    const loss = new DecoderLinkLoss("prefill", (l) => lines.push(l), {
      pingsPerMeasure: 2,
      probeBytes: 2 * 1024 * 1024,
      lossProbeDatagrams: 2000,
    });
    const probes: [string, number, number][] = [];
    loss.onProbe = (to, sent, lossEvents) => probes.push([to, sent, lossEvents]);
    assert.equal(loss.report(client.peerNodeId), null, "nothing before the first handoff");
    await loss.afterHandoff(client);
    const r = loss.report(client.peerNodeId)!;
    assert.deepEqual([r.sent, r.received, r.lossEvents], [2000, 1995, 5]);
    assert.deepEqual(probes, [[client.peerNodeId, 2000, 5]], "the choice of controller hears it");
    assert.ok(r.ageMs >= 0);
    assert.match(lines.join("\n"), /5 of 2000 datagrams lost in 5 loss events/);
    // A recent probe: the next handoff starts none (same probe reported).
    await loss.afterHandoff(client);
    assert.equal(loss.report(client.peerNodeId)!.probe, r.probe);
    assert.equal(lines.length, 1);
    assert.equal(probes.length, 1);
  } finally {
    link.drop();
  }
});

Deno.test("DecoderLinkLoss says so when the link carries no datagrams, and reports nothing", async () => {
  const nodes = await makeTestNodes();
  const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server);
  const lines: string[] = [];
  try {
    const loss = new DecoderLinkLoss("prefill", (l) => lines.push(l));
    await loss.afterHandoff(client);
    assert.equal(loss.report(client.peerNodeId), null);
    assert.deepEqual(lines, [], "no datagrams: no probe attempted, nothing to say per handoff");
  } finally {
    link.drop();
  }
});
