/**
 * PeerLinks over the loopback FAKE transport (real authentication, in-memory streams): one
 * link per peer shared by requests, per-request mailboxes, health per peer, and a dead peer
 * skipped without a connect until its backoff has passed.
 */
import assert from "node:assert/strict";
import { PeerError } from "../core/mod.ts";
import { type FakeLoopbackLink, fakeLoopbackPeers, type PeerConnection } from "../transport/mod.ts";
import { makeTrustingNodes } from "./local_cluster.ts";
import type { PeerAddress } from "./messages.ts";
import type { Node } from "./node.ts";
import { PeerDeadError, PeerLinks } from "./peer_links.ts";

interface Fixture {
  dir: string;
  client: Node;
  server: Node;
  address: PeerAddress;
  /** Server ends of every connection made, and their fake links. */
  accepted: { server: PeerConnection; link: FakeLoopbackLink }[];
  connects: number;
  /** While set, connects fail as a dead host's would. */
  down: boolean;
  links: PeerLinks;
}

async function fixture(backoffMs: number): Promise<Fixture> {
  const dir = await Deno.makeTempDir({ prefix: "skippy-links-" });
  const nodes = await makeTrustingNodes(dir, ["client", "server"]);
  const client = nodes.get("client")!;
  const server = nodes.get("server")!;
  const f = {
    dir,
    client,
    server,
    address: { nodeId: server.identity.nodeId, host: "127.0.0.1", port: 1 },
    accepted: [],
    connects: 0,
    down: false,
  } as unknown as Fixture;
  f.links = new PeerLinks(async () => {
    f.connects++;
    if (f.down) throw new PeerError("Cannot connect: no answer (a FAKE dead host)");
    const pair = await fakeLoopbackPeers(client.peerOptions(), server.peerOptions());
    f.accepted.push({ server: pair.server, link: pair.link });
    return pair.client;
  }, {
    connectTimeoutMs: 5_000,
    reconnectBackoffMs: backoffMs,
    reconnectBackoffMsMax: backoffMs * 4,
    requestQueueMessagesMax: 16,
  });
  return f;
}

async function cleanup(f: Fixture): Promise<void> {
  for (const a of f.accepted) a.link.drop();
  await f.links.close();
  await Deno.remove(f.dir, { recursive: true }).catch(() => {});
}

Deno.test("requests share one link per peer, and each reads only its own messages", async () => {
  const f = await fixture(60_000);
  try {
    const [a, b] = await Promise.all([f.links.get(f.address), f.links.get(f.address)]);
    assert.equal(a, b);
    assert.equal(f.connects, 1);
    assert.equal(f.links.health(f.address).state, "alive");
    const boxA = a.subscribe("req-a");
    const boxB = a.subscribe("req-b");
    assert.throws(() => a.subscribe("req-a"), /already running/);
    const server = f.accepted[0].server;
    // Interleaved answers for two requests, and one for a request nobody waits for.
    await server.send({ type: "Progress", handoffId: "req-b", done: 1 });
    await server.send({ type: "Progress", handoffId: "gone", done: 1 });
    await server.send({ type: "Progress", handoffId: "req-a", done: 2 });
    await server.send({ type: "Progress", handoffId: "req-b", done: 3 });
    assert.equal((await boxA.next()).header.done, 2);
    assert.equal((await boxB.next()).header.done, 1);
    assert.equal((await boxB.next()).header.done, 3);
    a.unsubscribe("req-a");
    a.unsubscribe("req-b");
    assert.equal(await f.links.get(f.address), a); // reused by the next request
    assert.equal(f.connects, 1);
  } finally {
    await cleanup(f);
  }
});

Deno.test("a lost link delivers what arrived, then fails its requests and marks the peer dead", async () => {
  const f = await fixture(60_000);
  try {
    const link = await f.links.get(f.address);
    const box = link.subscribe("req");
    await f.accepted[0].server.send({ type: "Progress", handoffId: "req", done: 7 });
    await new Promise((r) => setTimeout(r, 20)); // the message is in the mailbox
    f.accepted[0].link.kill("server");
    await new Promise((r) => link.lost.addEventListener("abort", r, { once: true }));
    assert.equal((await box.next()).header.done, 7);
    await assert.rejects(
      () => box.next(),
      (e) => e instanceof PeerError && /was lost/.test(e.message),
    );
    const health = f.links.health(f.address);
    assert.equal(health.state, "dead");
    assert.ok(health.reason && health.reason.length > 0);
    assert.equal(health.failures, 1);
    // Known dead: the next request fails at once, without a connect.
    await assert.rejects(() => f.links.get(f.address), PeerDeadError);
    assert.equal(f.connects, 1);
  } finally {
    await cleanup(f);
  }
});

Deno.test("a dead peer is skipped until its backoff passes, then tried again", async () => {
  const f = await fixture(100);
  try {
    f.down = true;
    await assert.rejects(() => f.links.get(f.address), /FAKE dead host/);
    assert.equal(f.connects, 1);
    const dead = f.links.health(f.address);
    assert.equal(dead.state, "dead");
    assert.match(dead.reason!, /FAKE dead host/);
    // Within the backoff: refused without a connect, saying since when and why.
    const error = await f.links.get(f.address).catch((e) => e);
    assert.ok(error instanceof PeerDeadError);
    assert.match(error.message, /dead since .*FAKE dead host/);
    assert.equal(f.connects, 1);
    // After it (a timer, not compute): tried again; a second failure doubles the backoff.
    await new Promise((r) => setTimeout(r, 150));
    await assert.rejects(() => f.links.get(f.address), /FAKE dead host/);
    assert.equal(f.connects, 2);
    assert.equal(f.links.health(f.address).failures, 2);
    assert.ok(f.links.health(f.address).retryInMs > 100);
    // Back up: the first use after the backoff connects, and the peer is alive again.
    f.down = false;
    await new Promise((r) => setTimeout(r, 250));
    await f.links.get(f.address);
    assert.equal(f.connects, 3);
    assert.equal(f.links.health(f.address).state, "alive");
    assert.equal(f.links.health(f.address).failures, 0);
  } finally {
    await cleanup(f);
  }
});

Deno.test("forget() clears a dead peer's backoff; a trust error never marks a peer dead", async () => {
  const f = await fixture(60_000);
  try {
    f.down = true;
    await assert.rejects(() => f.links.get(f.address));
    f.down = false;
    f.links.forget(f.address); // an operator restarted it
    await f.links.get(f.address);
    assert.equal(f.links.health(f.address).state, "alive");
    const untrusted = new PeerLinks(() =>
      Promise.reject(new PeerError('Peer "x" at h:1 is not in the trust list'))
    );
    const to = { nodeId: "x", host: "h", port: 1 };
    await assert.rejects(() => untrusted.get(to), /trust list/);
    assert.equal(untrusted.health(to).state, "unknown");
  } finally {
    await cleanup(f);
  }
});

Deno.test("retire(): the next request connects afresh; the old link's requests finish there, then it closes", async () => {
  const f = await fixture(60_000);
  try {
    const old = await f.links.get(f.address);
    const box = old.subscribe("running");
    f.links.retire(f.address.nodeId);
    const fresh = await f.links.get(f.address);
    assert.notEqual(fresh, old);
    assert.equal(f.connects, 2);
    // The running request still reads its answers on the old link.
    await f.accepted[0].server.send({ type: "Progress", handoffId: "running", done: 4 });
    assert.equal((await box.next()).header.done, 4);
    assert.equal(old.lost.aborted, false);
    assert.equal(old.retired, true);
    assert.equal(fresh.retired, false);
    old.unsubscribe("running"); // its last request ended: it closes
    assert.equal(old.lost.aborted, true);
    // Retiring is no failure: the peer stays alive on its fresh link.
    assert.equal(f.links.health(f.address).state, "alive");
    assert.equal(fresh.lost.aborted, false);
    // A link with no request closes at once.
    f.links.retire(f.address.nodeId);
    assert.equal(fresh.lost.aborted, true);
    assert.equal(f.links.health(f.address).state, "alive");
  } finally {
    await cleanup(f);
  }
});
