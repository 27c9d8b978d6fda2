/**
 * FAKE transport for tests: an in-memory link whose two ends are RawConnections, so the real
 * framing, authentication, capability, credit and PeerConnection code runs over it unchanged.
 * With a FaultPlan (fault_plan.ts) it drops, cuts, corrupts, duplicates, delays or kills.
 *
 * It mimics the Deno QUIC behaviour the protocol must survive: `writer.abort()` ends a stream
 * cleanly, a channel becomes visible to the peer only with its first byte, a killed peer is
 * noticed only after `maxIdleTimeoutMs`, pending reads then reject, and each direction has a
 * bounded buffer so backpressure is real. It does not model throughput, packet loss or TLS:
 * nothing that claims performance or security may rely on it. Datagrams exist only when
 * asked for (`datagrams`), and lose exactly what `dropEvery` says: fault injection for the
 * loss probe's protocol, not a model of a link.
 */
import { BoundedQueue } from "../core/queue.ts";
import {
  type ByteChannel,
  CloseCode,
  type ConnectionEnd,
  type DatagramPort,
  type RawConnection,
} from "./channel.ts";
import { type FaultPlan, withFaults } from "./fault_plan.ts";
import { establishPeer } from "./establish.ts";
import type { PeerConnection, PeerOptions } from "./peer.ts";

/** Settings of a fake link. */
export interface FakeLinkOptions {
  /** How long a survivor takes to notice a killed peer. Default 2000. */
  maxIdleTimeoutMs?: number;
  /** Buffered bytes per stream direction before writes wait. Default 256 KiB. */
  bufferBytesMax?: number;
  /** Streams either side may open over the link's lifetime. Default 1024. */
  streamsMax?: number;
  faults?: FaultPlan;
  /**
   * Datagrams on both ends (absent: none, as on a transport without them): `maxBytes` each
   * (default 1162), the `dropEvery`-th of each direction lost (absent: none lost), at most
   * `queueMax` waiting per receiver (default 4096; more are lost, as in a full buffer).
   */
  datagrams?: { maxBytes?: number; dropEvery?: number; queueMax?: number };
}

type Side = "client" | "server";

/** One direction of one stream: a bounded in-memory pipe with Deno-like end semantics. */
class _Pipe {
  readonly readable: ReadableStream<Uint8Array>;
  readonly writable: WritableStream<Uint8Array>;
  readonly #innerWriter: WritableStreamDefaultWriter<Uint8Array>;

  constructor(bufferBytes: number, link: FakeLoopbackLink, onFirstByte: () => void) {
    const strategy = { highWaterMark: bufferBytes, size: (chunk: Uint8Array) => chunk.byteLength };
    let first = true;
    const inner = new TransformStream<Uint8Array, Uint8Array>(
      {
        transform(chunk, controller) {
          if (link.frozen) return; // a killed peer: nothing gets through any more
          if (first && chunk.length > 0) {
            first = false;
            onFirstByte();
          }
          controller.enqueue(chunk.slice()); // the sender may reuse its buffer, as with QUIC
        },
      },
      strategy,
      strategy,
    );
    this.readable = inner.readable;
    this.#innerWriter = inner.writable.getWriter();
    const writer = this.#innerWriter;
    this.writable = new WritableStream<Uint8Array>({
      async write(chunk) {
        await writer.ready;
        await writer.write(chunk);
      },
      close: () => writer.close().catch(() => {}),
      // Like Deno QUIC: abort looks exactly like a clean end to the reader.
      abort: () => writer.close().catch(() => {}),
    });
  }

  /** The connection is gone: pending and later reads and writes reject. */
  fail(error: Error): void {
    this.#innerWriter.abort(error).catch(() => {});
  }
}

/** One end of the fake link. */
class _FakeEnd implements RawConnection {
  readonly closed: Promise<ConnectionEnd>;
  readonly incoming: BoundedQueue<ByteChannel>;
  datagrams?: DatagramPort;
  ended = false;
  #resolve!: (end: ConnectionEnd) => void;

  constructor(
    readonly link: FakeLoopbackLink,
    readonly side: Side,
    readonly serverCertificateSha256: Uint8Array,
    readonly maxIdleTimeoutMs: number,
    streamsMax: number,
  ) {
    this.incoming = new BoundedQueue(streamsMax);
    this.closed = new Promise((resolve) => this.#resolve = resolve);
  }

  get remoteAddress(): string {
    return `loopback:${this.side === "client" ? "server" : "client"}`;
  }

  openChannel(): Promise<ByteChannel> {
    return Promise.resolve(this.link.openChannel(this.side));
  }

  async acceptChannel(): Promise<ByteChannel | null> {
    return (await this.incoming.shift().catch(() => undefined)) ?? null;
  }

  close(closeCode: number = CloseCode.normal, reason = ""): void {
    this.link.closeFrom(this.side, closeCode, reason);
  }

  end(info: ConnectionEnd): void {
    if (this.ended) return;
    this.ended = true;
    this.incoming.close();
    this.#resolve(info);
  }
}

/** A FAKE in-memory link between a client end and a server end. */
export class FakeLoopbackLink {
  readonly client: RawConnection;
  readonly server: RawConnection;
  /** True once a side was killed: the link delivers nothing more. */
  frozen = false;
  readonly #ends: Record<Side, _FakeEnd>;
  readonly #pipes = new Set<_Pipe>();
  readonly #bufferBytes: number;
  #streams = 0;
  readonly #streamsMax: number;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(options: FakeLinkOptions = {}) {
    const certificateHash = crypto.getRandomValues(new Uint8Array(32)); // stands in for the TLS pin
    const idle = options.maxIdleTimeoutMs ?? 2_000;
    this.#bufferBytes = options.bufferBytesMax ?? 256 * 1024;
    this.#streamsMax = options.streamsMax ?? 1024;
    this.#ends = {
      client: new _FakeEnd(this, "client", certificateHash, idle, this.#streamsMax),
      server: new _FakeEnd(this, "server", certificateHash, idle, this.#streamsMax),
    };
    const faults = options.faults;
    const hooks = {
      dropConnection: () => this.drop(),
      killSender: () => this.kill(faults?.sender ?? "client"),
    };
    const wrap = (side: Side) =>
      faults && (faults.sender ?? "client") === side
        ? withFaults(this.#ends[side], faults, hooks)
        : this.#ends[side];
    if (options.datagrams) this.#openDatagrams(options.datagrams);
    this.client = wrap("client");
    this.server = wrap("server");
  }

  #openDatagrams(o: NonNullable<FakeLinkOptions["datagrams"]>): void {
    const maxBytes = o.maxBytes ?? 1162;
    const queues = {
      client: new BoundedQueue<Uint8Array>(o.queueMax ?? 4096),
      server: new BoundedQueue<Uint8Array>(o.queueMax ?? 4096),
    };
    for (const side of ["client", "server"] as const) {
      const end = this.#ends[side];
      const other = side === "client" ? "server" : "client";
      let sent = 0;
      end.closed.then(() => queues[side].close());
      end.datagrams = {
        maxBytes,
        send: (data) => {
          if (end.ended || this.frozen) return Promise.reject(new Error("connection lost"));
          if (data.length > maxBytes) {
            return Promise.reject(new Error(`datagram of ${data.length} B over ${maxBytes}`));
          }
          sent++;
          if (!(o.dropEvery && sent % o.dropEvery === 0)) queues[other].tryPush(data.slice());
          return Promise.resolve();
        },
        receive: async () => (await queues[side].shift().catch(() => undefined)) ?? null,
      };
    }
  }

  /** Used by the ends: a new stream from `side`; the other side sees it at its first byte. */
  openChannel(side: Side): ByteChannel {
    if (this.#ends[side].ended) throw new Error("connection lost");
    if (++this.#streams > this.#streamsMax) throw new Error("too many streams on the fake link");
    const other = this.#ends[side === "client" ? "server" : "client"];
    const outbound = new _Pipe(this.#bufferBytes, this, () => {
      other.incoming.tryPush({ readable: outbound.readable, writable: inbound.writable });
    });
    const inbound = new _Pipe(this.#bufferBytes, this, () => {});
    this.#pipes.add(outbound).add(inbound);
    return { readable: inbound.readable, writable: outbound.writable };
  }

  /** Used by the ends: `side` closed the connection; the peer sees the code and reason. */
  closeFrom(side: Side, closeCode: number, reason: string): void {
    const other = side === "client" ? "server" : "client";
    this.#endAll({
      [side]: { closeCode: 0, reason: "", timedOut: false },
      [other]: { closeCode, reason, timedOut: false },
    });
  }

  /** The connection drops: both sides see it closed with the fault code. */
  drop(): void {
    const info = {
      closeCode: CloseCode.faultInjected,
      reason: "fault: connection dropped",
      timedOut: false,
    };
    this.#endAll({ client: info, server: info });
  }

  /**
   * `side` dies silently: nothing more is delivered, and the survivor's connection ends only
   * when its idle timeout expires, as with a killed process on real QUIC.
   */
  kill(side: Side): void {
    if (this.frozen) return;
    this.frozen = true;
    this.#ends[side].end({ closeCode: 0, reason: "killed", timedOut: false });
    const survivor = this.#ends[side === "client" ? "server" : "client"];
    this.#idleTimer = setTimeout(() => {
      this.#endAll({ [survivor.side]: { closeCode: 0, reason: "timed out", timedOut: true } });
    }, survivor.maxIdleTimeoutMs);
  }

  #endAll(infos: Partial<Record<Side, ConnectionEnd>>): void {
    clearTimeout(this.#idleTimer);
    for (const side of ["client", "server"] as const) {
      const info = infos[side] ?? { closeCode: 0, reason: "", timedOut: false };
      this.#ends[side].end(info);
    }
    const error = new Error("connection lost");
    for (const pipe of this.#pipes) pipe.fail(error);
    this.#pipes.clear();
  }
}

/**
 * A FAKE link with both ends authenticated: returns the client's and the server's
 * PeerConnection. Handshake failures reject as they would over QUIC.
 */
export async function fakeLoopbackPeers(
  client: PeerOptions,
  server: PeerOptions,
  options: FakeLinkOptions = {},
): Promise<{ client: PeerConnection; server: PeerConnection; link: FakeLoopbackLink }> {
  const link = new FakeLoopbackLink(options);
  const serverSide = establishPeer(link.server, "server", server);
  serverSide.catch(() => {}); // reported through the client's failure or awaited below
  const clientPeer = await establishPeer(link.client, "client", client);
  return { client: clientPeer, server: await serverSide, link };
}
