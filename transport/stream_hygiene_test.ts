/**
 * Streams that do not open as a handoff stream are closed at once, and a handoff stream gets
 * credit only once the receiver has matched and accepted it: over the loopback fake and over
 * real QUIC on 127.0.0.1.
 */
import { assert, assertEquals, assertRejects } from "../testing/assert.ts";
import { PeerError } from "../core/errors.ts";
import type { RawConnection } from "./channel.ts";
import { makeTestNodes, type TestNodes } from "./_conformance.ts";
import { establishPeer } from "./establish.ts";
import { encodeFrame } from "./frame.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";
import { FakeLoopbackLink } from "./loopback.ts";
import type { PeerConnection, PeerOptions } from "./peer.ts";
import { connectQuicRaw, listenQuicRaw } from "./quic.ts";
import { createEphemeralTlsCertificate } from "./tls.ts";

interface Pair {
  /** The client's raw connection, to open streams the PeerConnection would never open. */
  clientRaw: RawConnection;
  client: PeerConnection;
  server: PeerConnection;
  cleanup(): Promise<void>;
}

const STEP_MS = 300;
/** QUIC: streams the client may have open at once (the control stream takes one). */
const QUIC_STREAMS_MAX = 3;

const harnesses: { name: string; pair(nodes: TestNodes, server: PeerOptions): Promise<Pair> }[] = [
  {
    name: "loopback fake",
    async pair(nodes, server) {
      const link = new FakeLoopbackLink();
      const serverSide = establishPeer(link.server, "server", server);
      const client = await establishPeer(link.client, "client", nodes.client);
      return {
        clientRaw: link.client,
        client,
        server: await serverSide,
        cleanup: () => Promise.resolve(link.drop()),
      };
    },
  },
  {
    name: "quic",
    async pair(nodes, server) {
      const certificate = await createEphemeralTlsCertificate();
      const listener = listenQuicRaw({
        certificate,
        maxConcurrentBidirectionalStreams: QUIC_STREAMS_MAX,
      });
      const serverSide = listener.accept().then((raw) => establishPeer(raw!, "server", server));
      serverSide.catch(() => {});
      const clientRaw = await connectQuicRaw({
        hostname: "127.0.0.1",
        port: listener.addr.port,
        serverCertificateSha256: certificate.sha256,
        maxConcurrentBidirectionalStreams: QUIC_STREAMS_MAX,
      });
      const client = await establishPeer(clientRaw, "client", nodes.client);
      return {
        clientRaw,
        client,
        server: await serverSide,
        cleanup: async () => {
          await client.close();
          listener.close();
        },
      };
    },
  },
];

/** Opens a raw stream, writes `bytes`, and returns a reader of what the server answers. */
async function openRaw(raw: RawConnection, bytes: Uint8Array) {
  const channel = await raw.openChannel();
  const writer = channel.writable.getWriter();
  await writer.write(bytes);
  writer.releaseLock();
  return { reader: new FrameReader(channel.readable), writer: new FrameWriter(channel.writable) };
}

function encoded(header: Record<string, unknown>): Uint8Array {
  const frame = encodeFrame(header);
  const out = new Uint8Array(frame.head.length + frame.payload.length);
  out.set(frame.head);
  out.set(frame.payload, frame.head.length);
  return out;
}

/** Sends one small handoff through a proper stream: proves the connection is still usable. */
async function handoffWorks(client: PeerConnection, server: PeerConnection): Promise<void> {
  const sender = await client.openHandoffStream({ handoffId: "ok" });
  const sending = (async () => {
    await sender.send({ type: "StateChunk", seq: 0 }, new Uint8Array(1000));
    return await sender.finish();
  })();
  const receiver = (await server.acceptHandoffStream())!.accept();
  assertEquals((await receiver.receive())?.header.seq, 0);
  assertEquals((await receiver.receive())?.header.type, "HandoffStreamEnd");
  assertEquals((await sending).frames, 2);
}

for (const harness of harnesses) {
  const test = (name: string, fn: () => Promise<void>) =>
    Deno.test({
      name: `[${harness.name}] ${name}`,
      sanitizeOps: false,
      sanitizeResources: false,
      fn,
    });

  test("a stream whose first bytes do not parse is refused and closed at once", async () => {
    const nodes = await makeTestNodes();
    const { clientRaw, client, server, cleanup } = await harness.pair(nodes, {
      ...nodes.server,
      handshakeStepMs: 60_000, // a refusal after this would be the deadline, not the parse
    });
    try {
      // More streams than QUIC lets the client have open at once: each must have been freed.
      for (let i = 0; i < QUIC_STREAMS_MAX + 3; i++) {
        const { reader, writer } = await openRaw(clientRaw, new Uint8Array(64).fill(0xab));
        const refusal = await reader.read();
        assertEquals(refusal?.header, { type: "StreamRefused", reason: "malformed opening frame" });
        assert(refusal?.final, "the refusal ends the server's direction");
        assertEquals(await reader.read(), null);
        await writer.close(); // QUIC frees the stream once both directions have ended
      }
      await handoffWorks(client, server);
    } finally {
      await cleanup();
    }
  });

  test("a stream that stalls before its opening frame is refused after handshakeStepMs", async () => {
    const nodes = await makeTestNodes();
    const { clientRaw, client, server, cleanup } = await harness.pair(nodes, {
      ...nodes.server,
      handshakeStepMs: STEP_MS,
    });
    try {
      for (let i = 0; i < QUIC_STREAMS_MAX + 1; i++) {
        const { reader, writer } = await openRaw(clientRaw, new Uint8Array([0x53, 0x44, 1]));
        const refusal = await reader.read();
        assertEquals(refusal?.header.type, "StreamRefused");
        assertEquals(
          refusal?.header.reason,
          `no opening frame within handshakeStepMs (${STEP_MS} ms)`,
        );
        await writer.close();
      }
      const { reader } = await openRaw(clientRaw, encoded({ type: "SomethingNewer" }));
      assertEquals((await reader.read())?.header.reason, "unknown stream type");
      await handoffWorks(client, server);
    } finally {
      await cleanup();
    }
  });

  test("no credit is granted before the receiver accepts; a refused stream got none", async () => {
    const nodes = await makeTestNodes();
    const { clientRaw, client, server, cleanup } = await harness.pair(nodes, nodes.server);
    try {
      // Raw opener: the first frame the server sends on the stream tells what came first.
      const refused = await openRaw(
        clientRaw,
        encoded({ type: "HandoffStreamOpen", meta: { handoffId: "unknown" } }),
      );
      const incoming = (await server.acceptHandoffStream())!;
      assertEquals(incoming.meta, { handoffId: "unknown" });
      await incoming.refuse("no reservation for this handoff stream");
      assertEquals((await refused.reader.read())?.header, {
        type: "HandoffStreamRefused",
        reason: "no reservation for this handoff stream",
      });
      assertEquals(await refused.reader.read(), null);
      await refused.writer.close();

      const accepted = await openRaw(
        clientRaw,
        encoded({ type: "HandoffStreamOpen", meta: { handoffId: "known" } }),
      );
      const receiver = (await server.acceptHandoffStream())!.accept();
      assertEquals((await accepted.reader.read())?.header, {
        type: "TransferCredit",
        grantedBytesTotal: 64 * 1024 * 1024,
      });
      await receiver.abort("test over");
      await accepted.writer.close();

      // Through the API: the sender of a refused stream sees PeerError and was granted nothing.
      const sender = await client.openHandoffStream({ handoffId: "unknown" });
      const sending = sender.send({ type: "StateChunk", seq: 0 }, new Uint8Array(10));
      sending.catch(() => {});
      await (await server.acceptHandoffStream())!.refuse("no reservation for this handoff stream");
      await assertRejects(() => sending, PeerError, "no reservation for this handoff stream");
      assertEquals(sender.credit, { grantedBytesTotal: 0, sentBytesTotal: 0 });
    } finally {
      await cleanup();
    }
  });
}
