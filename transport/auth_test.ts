import { assert, assertEquals, assertRejects } from "../testing/assert.ts";
import { LimitExceededError, PeerError } from "../core/errors.ts";
import { makeTestNodes } from "./_conformance.ts";
import type { RawConnection } from "./channel.ts";
import { FakeLoopbackLink } from "./loopback.ts";
import { establishPeer } from "./establish.ts";

/** The same raw connection, but claiming a different pinned certificate. */
function withPin(raw: RawConnection, pin: Uint8Array): RawConnection {
  return {
    openChannel: () => raw.openChannel(),
    acceptChannel: () => raw.acceptChannel(),
    close: (code, reason) => raw.close(code, reason),
    closed: raw.closed,
    serverCertificateSha256: pin,
    remoteAddress: raw.remoteAddress,
    maxIdleTimeoutMs: raw.maxIdleTimeoutMs,
  };
}

Deno.test("authentication binds to the pinned certificate: a client pinning another one is refused", async () => {
  const nodes = await makeTestNodes();
  const link = new FakeLoopbackLink();
  const [client, server] = await Promise.allSettled([
    establishPeer(withPin(link.client, new Uint8Array(32).fill(7)), "client", nodes.client),
    establishPeer(link.server, "server", nodes.server),
  ]);
  link.drop();
  assert(server.status === "rejected" && server.reason instanceof PeerError);
  assert(
    server.reason.message.includes("pinned a different TLS certificate"),
    server.reason.message,
  );
  assert(client.status === "rejected" && client.reason instanceof PeerError, String(client));
});

Deno.test("a server that never answers fails the handshake after handshakeTimeoutMs", async () => {
  const nodes = await makeTestNodes();
  const link = new FakeLoopbackLink();
  const started = performance.now();
  await assertRejects(
    () => establishPeer(link.client, "client", { ...nodes.client, handshakeTimeoutMs: 200 }),
    LimitExceededError,
    "handshakeTimeoutMs (200 ms)",
  );
  assert(performance.now() - started < 1000);
  link.drop();
});

Deno.test("expectedServerNodeId refuses a trusted server that is not the one asked for", async () => {
  const nodes = await makeTestNodes();
  const link = new FakeLoopbackLink();
  const [client] = await Promise.allSettled([
    establishPeer(link.client, "client", {
      ...nodes.client,
      expectedServerNodeId: "aaaaaaaaaaaaaaaa",
    }),
    establishPeer(link.server, "server", nodes.server),
  ]);
  link.drop();
  assert(client.status === "rejected" && client.reason instanceof PeerError);
  assert(client.reason.message.includes("not the expected aaaaaaaaaaaaaaaa"));
});

Deno.test("authentication succeeds with mutual trust and reports the peer's trust label", async () => {
  const nodes = await makeTestNodes();
  const link = new FakeLoopbackLink();
  const [client, server] = await Promise.all([
    establishPeer(link.client, "client", nodes.client),
    establishPeer(link.server, "server", nodes.server),
  ]);
  assertEquals(client.peerLabel, "server");
  assertEquals(server.peerLabel, "client");
  await client.close();
  assertEquals((await server.closed).closeCode, 0);
});
