/** The conformance suite against the loopback FAKE transport (cases and assertions: _conformance.ts). */
import { conformanceCases, type TransportHarness } from "./_conformance.ts";
import { FakeLoopbackLink, fakeLoopbackPeers } from "./loopback.ts";
import { establishPeer } from "./establish.ts";

const loopback: TransportHarness = {
  name: "loopback fake",
  async pair(nodes, options = {}) {
    const { client, server, link } = await fakeLoopbackPeers(
      { ...nodes.client, ...options.client },
      { ...nodes.server, ...options.server },
      { faults: options.faults },
    );
    return { client, server, cleanup: () => Promise.resolve(link.drop()) };
  },
  async attempt(nodes) {
    const link = new FakeLoopbackLink();
    const [client, server] = await Promise.allSettled([
      establishPeer(link.client, "client", nodes.client),
      establishPeer(link.server, "server", nodes.server),
    ]);
    return {
      clientError: client.status === "rejected" ? client.reason : null,
      serverError: server.status === "rejected" ? server.reason : null,
      cleanup: () => Promise.resolve(link.drop()),
    };
  },
  async killablePair(idleTimeoutMs) {
    const { makeTestNodes } = await import("./_conformance.ts");
    const nodes = await makeTestNodes();
    const { client, link } = await fakeLoopbackPeers(nodes.client, nodes.server, {
      maxIdleTimeoutMs: idleTimeoutMs,
    });
    return {
      client,
      kill: () => Promise.resolve(link.kill("server")),
      cleanup: () => Promise.resolve(link.drop()),
    };
  },
};

conformanceCases(loopback);
