/**
 * The transport conformance suite: one set of behaviours every transport must show, run
 * against the real QUIC transport (conformance_quic_test.ts) and the loopback fake
 * (conformance_loopback_test.ts), in the manner of Hono's router `common.case.test.ts`.
 */
import { assert, assertEquals, assertRejects } from "../testing/assert.ts";
import { HandoffAbortedError, PeerError, ProtocolError } from "../core/errors.ts";
import { CloseCode } from "./channel.ts";
import type { FaultPlan } from "./fault_plan.ts";
import { encodeFrame, FrameError } from "./frame.ts";
import type { PeerConnection, PeerOptions } from "./peer.ts";
import { makeTestNodes, type TestNodes } from "./test_nodes.ts";

// The transport tests import the node pair from here, beside the suite.
export { makeTestNodes, type TestNodes } from "./test_nodes.ts";

/** A connected pair and how to tear it down. */
export interface HarnessPair {
  client: PeerConnection;
  server: PeerConnection;
  cleanup(): Promise<void>;
}

/** What each transport provides to the suite. */
export interface TransportHarness {
  name: string;
  /** An authenticated pair built from `nodes`, with optional faults and option overrides. */
  pair(nodes: TestNodes, options?: {
    faults?: FaultPlan;
    client?: Partial<PeerOptions>;
    server?: Partial<PeerOptions>;
  }): Promise<HarnessPair>;
  /** Connects with `nodes`; resolves with the error each side saw (null if it succeeded). */
  attempt(
    nodes: TestNodes,
  ): Promise<{ clientError: Error | null; serverError: Error | null; cleanup(): Promise<void> }>;
  /** A client connected to a server that is then killed without closing. */
  killablePair(
    idleTimeoutMs: number,
  ): Promise<{ client: PeerConnection; kill(): Promise<void>; cleanup(): Promise<void> }>;
}

/** Deterministic page content, so corruption or reordering shows up. */
function page(seq: number, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 4096) out[i] = (seq * 7 + i / 4096) & 0xff;
  out[bytes - 1] = seq & 0xff;
  return out;
}

function samePage(actual: Uint8Array, seq: number, bytes: number): boolean {
  const expected = page(seq, bytes);
  if (actual.length !== bytes) return false;
  for (let i = 0; i < bytes; i += 4096) if (actual[i] !== expected[i]) return false;
  return actual[bytes - 1] === expected[bytes - 1];
}

const OPEN_META = { handoffId: "h-1" };
/** Wire bytes of the opening frame, so faults can target offsets in the data after it. */
const OPEN_BYTES = encodeFrame({ type: "HandoffStreamOpen", meta: OPEN_META }).wireBytes;
const PAGE_BYTES = 64 * 1024;
const PAGE_WIRE_BYTES =
  encodeFrame({ type: "StateChunk", seq: 0 }, new Uint8Array(PAGE_BYTES)).wireBytes;

/** Registers one case of the suite under the transport's name. */
type Register = (name: string, fn: () => Promise<void>) => void;

/** Registers every conformance case for `harness`, group by group. */
export function conformanceCases(harness: TransportHarness): void {
  const test: Register = (name, fn) =>
    Deno.test({
      name: `[${harness.name}] ${name}`,
      sanitizeOps: false,
      sanitizeResources: false,
      fn,
    });
  exchangeCases(harness, test);
  peerCases(harness, test);
  damagedStreamCases(harness, test);
}

/**
 * Control messages and handoff streams doing their work: a round trip, credit, a sender held
 * by a full window, a receiver's abort.
 */
function exchangeCases(harness: TransportHarness, test: Register): void {
  test("a control message round trip carries header, payload and capabilities", async () => {
    const nodes = await makeTestNodes();
    const { client, server, cleanup } = await harness.pair(nodes);
    try {
      assertEquals(client.peerNodeId, nodes.server.identity.nodeId);
      assertEquals(server.peerNodeId, nodes.client.identity.nodeId);
      assertEquals(client.peerCapabilities.roles, ["decode"]);
      assertEquals(server.peerCapabilities.roles, ["prefill"]);
      await client.send({ type: "ReserveRequest", handoffId: "h-1" }, new Uint8Array([1, 2, 3]));
      const request = await server.receive();
      assertEquals(request?.header, { type: "ReserveRequest", handoffId: "h-1" });
      assertEquals(Array.from(request!.payload), [1, 2, 3]);
      await server.send({ type: "ReserveAccepted" });
      assertEquals((await client.receive())?.header.type, "ReserveAccepted");
      await client.close();
      assertEquals(await server.receive(), null, "a graceful close ends the peer's messages");
    } finally {
      await cleanup();
    }
  });

  test("a handoff stream moves 8 MiB in order without exceeding granted credit", async () => {
    const nodes = await makeTestNodes();
    const inflightBytesMax = 512 * 1024;
    const { client, server, cleanup } = await harness.pair(nodes, {
      server: { handoff: { inflightBytesMax } },
    });
    try {
      const pages = 128;
      const receiving = (async () => {
        const receiver = (await server.acceptHandoffStream())!.accept();
        assertEquals(receiver.meta, OPEN_META);
        let seq = 0;
        for await (const frame of receiver) {
          if (frame.header.type === "HandoffStreamEnd") break;
          assert(receiver.stagedBytes <= inflightBytesMax, "staged bytes exceed the window");
          assert(samePage(frame.payload, seq, PAGE_BYTES), `page ${seq} differs`);
          assertEquals(frame.header.seq, seq++);
        }
        return seq;
      })();
      const sender = await client.openHandoffStream(OPEN_META);
      for (let seq = 0; seq < pages; seq++) {
        await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
        assert(
          sender.credit.sentBytesTotal <= sender.credit.grantedBytesTotal,
          "sent beyond credit",
        );
      }
      const receipt = await sender.finish();
      assertEquals(await receiving, pages);
      assertEquals(receipt.frames, pages + 1);
      // Grants are cumulative and trail what was released by at most one window.
      const wireTotal = pages * PAGE_WIRE_BYTES + receipt.wireBytes - pages * PAGE_WIRE_BYTES;
      assert(
        sender.credit.grantedBytesTotal <= wireTotal + inflightBytesMax,
        "granted beyond one window",
      );
    } finally {
      await cleanup();
    }
  });

  test("a sender stalls while the receiver holds a full window, and resumes on release", async () => {
    const nodes = await makeTestNodes();
    const inflightBytesMax = 4 * PAGE_WIRE_BYTES;
    const { client, server, cleanup } = await harness.pair(nodes, {
      server: { handoff: { inflightBytesMax, manualRelease: true } },
    });
    try {
      const sender = await client.openHandoffStream(OPEN_META);
      const receiver = (await server.acceptHandoffStream())!.accept();
      const sending = (async () => {
        for (let seq = 0; seq < 8; seq++) {
          await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
        }
        return await sender.finish();
      })();
      const held = [];
      for (let i = 0; i < 4; i++) held.push((await receiver.receive())!);
      await new Promise((r) => setTimeout(r, 150));
      assertEquals(
        sender.credit.sentBytesTotal,
        inflightBytesMax,
        "sender must stop at the window",
      );
      for (const frame of held) receiver.release(frame);
      for (;;) {
        const frame = await receiver.receive();
        if (frame === null) break;
        receiver.release(frame);
      }
      assertEquals((await sending).frames, 9);
    } finally {
      await cleanup();
    }
  });

  test("a receiver that aborts mid-transfer is named by the sender's next send, however the stop races", async () => {
    const nodes = await makeTestNodes();
    const { client, server, cleanup } = await harness.pair(nodes);
    try {
      const sender = await client.openHandoffStream(OPEN_META);
      const receiver = (await server.acceptHandoffStream())!.accept();
      // The sender keeps writing while the receiver aborts after its first page: a write may
      // fail on the stopped stream before the receiver's reason is read, and must still
      // report that reason, not a lost connection.
      const sending = (async () => {
        for (let seq = 0; seq < 1024; seq++) {
          await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
        }
        throw new Error("every page was sent: the abort was not seen");
      })();
      assertEquals((await receiver.receive())?.header.seq, 0);
      await receiver.abort("bad chunk");
      const error = await assertRejects(() => sending, HandoffAbortedError, "bad chunk");
      assertEquals(error.reason, "receiver-aborted");
    } finally {
      await cleanup();
    }
  });
}

/** The peer itself: one that dies without closing, and one either side does not trust. */
function peerCases(harness: TransportHarness, test: Register): void {
  test("a killed peer is detected within maxIdleTimeoutMs + 1.5 s, never a hang", async () => {
    const idleTimeoutMs = 1_000;
    const { client, kill, cleanup } = await harness.killablePair(idleTimeoutMs);
    try {
      const pending = client.receive();
      pending.catch(() => {});
      await kill();
      const started = performance.now();
      await assertRejects(() => pending, PeerError, "lost");
      const end = await client.closed;
      const elapsed = performance.now() - started;
      assert(end.timedOut, `expected an idle timeout, got ${JSON.stringify(end)}`);
      assert(elapsed < idleTimeoutMs + 1_500, `took ${elapsed.toFixed(0)} ms`);
    } finally {
      await cleanup();
    }
  });

  test("a peer that does not trust the client refuses it, naming the node and the fix", async () => {
    const nodes = await makeTestNodes({ server: false });
    const { clientError, serverError, cleanup } = await harness.attempt(nodes);
    try {
      assert(clientError instanceof PeerError, `client saw ${clientError}`);
      assert(clientError.message.includes("refused this node"), clientError.message);
      assert(serverError instanceof PeerError, `server saw ${serverError}`);
      assert(
        serverError.message.includes(`Refused peer ${nodes.client.identity.nodeId}`),
        serverError.message,
      );
      assert(serverError.hint?.includes(`trust add ${nodes.client.identity.publicKeyText}`));
    } finally {
      await cleanup();
    }
  });

  test("a client that does not trust the server refuses it before proving itself", async () => {
    const nodes = await makeTestNodes({ client: false });
    const { clientError, serverError, cleanup } = await harness.attempt(nodes);
    try {
      assert(clientError instanceof PeerError, `client saw ${clientError}`);
      assert(
        clientError.message.includes(`Refused peer ${nodes.server.identity.nodeId}`),
        clientError.message,
      );
      assert(clientError.hint?.includes(`trust add ${nodes.server.identity.publicKeyText}`));
      assert(serverError instanceof PeerError, `server saw ${serverError}`);
    } finally {
      await cleanup();
    }
  });
}

/** Damaged streams: a corrupted frame, an oversized one, a cut stream, a dropped connection. */
function damagedStreamCases(harness: TransportHarness, test: Register): void {
  test("a corrupted handoff frame is refused with a checksum error", async () => {
    const nodes = await makeTestNodes();
    const faults = { streamIndex: 1, corruptByteAt: OPEN_BYTES + PAGE_WIRE_BYTES + 500 };
    const { client, server, cleanup } = await harness.pair(nodes, { faults });
    try {
      const sender = await client.openHandoffStream(OPEN_META);
      const sending = (async () => {
        for (let seq = 0; seq < 3; seq++) {
          await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
        }
      })();
      sending.catch(() => {});
      const receiver = (await server.acceptHandoffStream())!.accept();
      assertEquals((await receiver.receive())?.header.seq, 0);
      const error = await assertRejects(() => receiver.receive(), FrameError, "checksum mismatch");
      assertEquals(error.kind, "bad-checksum");
    } finally {
      await cleanup();
    }
  });

  test("an oversized frame is refused before it is buffered, on handoff and control streams", async () => {
    const nodes = await makeTestNodes();
    const { client, server, cleanup } = await harness.pair(nodes, {
      client: { handoff: { frameLimits: { headerBytesMax: 4096, payloadBytesMax: 1 << 20 } } },
      server: {
        handoff: { frameLimits: { headerBytesMax: 4096, payloadBytesMax: 32 * 1024 } },
        controlFrameLimits: { headerBytesMax: 4096, payloadBytesMax: 1024 },
      },
    });
    try {
      const sender = await client.openHandoffStream(OPEN_META);
      sender.send({ type: "StateChunk", seq: 0 }, new Uint8Array(PAGE_BYTES)).catch(() => {});
      const receiver = (await server.acceptHandoffStream())!.accept();
      const error = await assertRejects(
        () => receiver.receive(),
        FrameError,
        "exceeds payloadBytesMax (32768)",
      );
      assertEquals(error.kind, "payload-too-large");
      // The server may close the connection before the client has finished writing.
      client.send({ type: "Big" }, new Uint8Array(4096)).catch(() => {});
      await assertRejects(() => server.receive(), ProtocolError, "exceeds payloadBytesMax (1024)");
      const end = await client.closed;
      assertEquals(
        end.closeCode,
        CloseCode.protocolError,
        "a protocol violation closes the connection",
      );
    } finally {
      await cleanup();
    }
  });

  test("a stream cut mid-frame and one cut between frames are told apart", async () => {
    for (
      const [cut, kind] of [[OPEN_BYTES + PAGE_WIRE_BYTES + 100, "ended-mid-frame"], [
        OPEN_BYTES + 2 * PAGE_WIRE_BYTES,
        "ended-before-final",
      ]] as const
    ) {
      const nodes = await makeTestNodes();
      const { client, server, cleanup } = await harness.pair(nodes, {
        faults: { endStreamAfterBytes: cut },
      });
      try {
        const sender = await client.openHandoffStream(OPEN_META);
        (async () => {
          for (let seq = 0; seq < 4; seq++) {
            await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
          }
        })().catch(() => {});
        const receiver = (await server.acceptHandoffStream())!.accept();
        assertEquals((await receiver.receive())?.header.seq, 0);
        if (kind === "ended-before-final") assertEquals((await receiver.receive())?.header.seq, 1);
        const error = await assertRejects(() => receiver.receive(), FrameError);
        assertEquals(error.kind, kind);
      } finally {
        await cleanup();
      }
    }
  });

  test("a connection dropped mid-transfer aborts both ends of the handoff stream", async () => {
    const nodes = await makeTestNodes();
    const faults = { dropConnectionAfterBytes: OPEN_BYTES + PAGE_WIRE_BYTES + 10 };
    const { client, server, cleanup } = await harness.pair(nodes, { faults });
    try {
      const sender = await client.openHandoffStream(OPEN_META);
      const sending = (async () => {
        for (let seq = 0; seq < 16; seq++) {
          await sender.send({ type: "StateChunk", seq }, page(seq, PAGE_BYTES));
        }
        await sender.finish();
      })();
      sending.catch(() => {}); // asserted below; keep it from counting as unhandled meanwhile
      // Over QUIC the close may discard in-flight data: the stream may even never appear.
      const receiver = (await server.acceptHandoffStream())?.accept();
      if (receiver) {
        const error = await assertRejects(async () => {
          while (await receiver.receive() !== null);
        }, Error);
        assert(
          error instanceof HandoffAbortedError || error instanceof FrameError,
          `receiver saw ${error}`,
        );
      }
      await assertRejects(() => sending, Error);
    } finally {
      await cleanup();
    }
  });
}
