/**
 * The real transport: Deno's native QUIC (`--unstable-net`), adapted to RawConnection, then
 * authenticated into PeerConnection by peer.ts.
 *
 * Choices forced by measured Deno 2.9.6 behaviour (see shared/reference/deno-quic-facts.md):
 * - The client pins the server's exact certificate with `serverCertificateHashes` (accepted by
 *   the runtime though not declared in its types). Given a hash, Deno checks the certificate
 *   against it alone, not CAs or names, so peers can be reached by any address. If a future
 *   runtime ignored the option, verification would fall back to public CAs and fail: it fails
 *   closed.
 * - A dead peer is noticed only through the idle timeout, so `maxIdleTimeoutMs` defaults to
 *   2 s, with keep-alives at a quarter of that so a healthy idle connection never times out.
 * - `QuicIncoming.remoteAddr` is read only after `accept()` (reading it first consumes the
 *   connection).
 */
import { LimitExceededError, PeerError } from "../core/errors.ts";
import { BoundedQueue } from "../core/queue.ts";
import { PROTOCOL_LABEL } from "./auth.ts";
import {
  type ByteChannel,
  CloseCode,
  type ConnectionEnd,
  type DatagramPort,
  type RawConnection,
} from "./channel.ts";
import { establishPeer } from "./establish.ts";
import { HandshakeGate, type HandshakeGateOptions, sourceOfAddress } from "./handshake_gate.ts";
import type { PeerConnection, PeerOptions } from "./peer.ts";
import type { TlsCertificate } from "./tls.ts";

/** ALPN protocol id; the version in it changes with any incompatible wire change. */
export const ALPN_PROTOCOL = PROTOCOL_LABEL;
export const DEFAULT_MAX_IDLE_TIMEOUT_MS = 2_000;

/** QUIC transport settings shared by both sides. */
export interface QuicTransportOptions {
  /** A peer silent this long is declared dead (the lower of both sides' values applies). */
  maxIdleTimeoutMs?: number;
  /** Keep-alive period; default a quarter of `maxIdleTimeoutMs`. */
  keepAliveIntervalMs?: number;
  /**
   * This side's sending controller: "cubic" (Deno's "default" and "throughput") or "bbr"
   * (Deno's "low-latency"; holds its rate under random loss). Default "cubic".
   */
  congestionControl?: "cubic" | "bbr" | "default" | "throughput" | "low-latency";
  /** Streams the peer may have open at once (control + handoff streams). */
  maxConcurrentBidirectionalStreams?: number;
}

/**
 * Test hook: wraps each raw connection before authentication, e.g. with `withFaults`
 * (fault_plan.ts) or a tap. Nothing in the product passes one.
 */
export type RawConnectionWrapper = (raw: RawConnection) => RawConnection;

/** Where and with what certificate to listen. */
export interface QuicServerOptions extends QuicTransportOptions {
  /** Default 127.0.0.1: listening on other interfaces is an explicit choice. */
  hostname?: string;
  /** Default 0 (an ephemeral port; read it from `addr`). */
  port?: number;
  certificate: TlsCertificate;
  /** TLS-complete connections waiting for `accept()`; more are refused. */
  acceptQueueMax?: number;
  /**
   * QUIC/TLS handshakes in progress at once; further connection attempts are refused before
   * any TLS work. A stalled one ends at the QUIC idle timeout.
   */
  tlsHandshakesInFlightMax?: number;
}

export const DEFAULT_TLS_HANDSHAKES_IN_FLIGHT_MAX = 256;

/** Where to connect and which certificate to accept there. */
export interface QuicClientOptions extends QuicTransportOptions {
  hostname: string;
  port: number;
  /** SHA-256 of the server's certificate (from its `identity show --json`). */
  serverCertificateSha256: Uint8Array;
}

function _transportOptions(options: QuicTransportOptions): Deno.QuicTransportOptions {
  const idle = options.maxIdleTimeoutMs ?? DEFAULT_MAX_IDLE_TIMEOUT_MS;
  return {
    maxIdleTimeout: idle,
    keepAliveInterval: options.keepAliveIntervalMs ?? Math.max(50, Math.floor(idle / 4)),
    congestionControl: _denoCongestionControl(options.congestionControl),
    maxConcurrentBidirectionalStreams: options.maxConcurrentBidirectionalStreams ?? 32,
    maxConcurrentUnidirectionalStreams: 0,
  };
}

function _denoCongestionControl(
  name: QuicTransportOptions["congestionControl"],
): "default" | "throughput" | "low-latency" {
  if (name === undefined || name === "cubic") return "default";
  return name === "bbr" ? "low-latency" : name;
}

/** Adapts a QuicConn to RawConnection. */
class QuicRawConnection implements RawConnection {
  readonly closed: Promise<ConnectionEnd>;
  readonly datagrams?: DatagramPort;
  readonly #conn: Deno.QuicConn;
  readonly #incoming: ReadableStreamDefaultReader<Deno.QuicBidirectionalStream>;

  constructor(
    conn: Deno.QuicConn,
    readonly serverCertificateSha256: Uint8Array,
    readonly remoteAddress: string,
    readonly maxIdleTimeoutMs: number,
  ) {
    this.#conn = conn;
    this.#incoming = conn.incomingBidirectionalStreams.getReader();
    // Both ends of Deno's QUIC accept DATAGRAM frames (1,162 bytes each on loopback here).
    if (conn.maxDatagramSize > 0) {
      this.datagrams = {
        get maxBytes() {
          return conn.maxDatagramSize;
        },
        send: (data) => conn.sendDatagram(data),
        receive: () => conn.readDatagram().catch(() => null),
      };
    }
    // A killed peer makes `closed` reject with "timed out" rather than resolve.
    this.closed = conn.closed.then(
      (info) => ({ closeCode: info.closeCode, reason: info.reason, timedOut: false }),
      (error) => ({
        closeCode: 0,
        reason: String(error?.message ?? error),
        timedOut: /timed out/i.test(String(error)),
      }),
    );
  }

  async openChannel(): Promise<ByteChannel> {
    return await this.#conn.createBidirectionalStream({ waitUntilAvailable: true });
  }

  async acceptChannel(): Promise<ByteChannel | null> {
    try {
      const { value, done } = await this.#incoming.read();
      return done ? null : value;
    } catch {
      return null; // the connection ended
    }
  }

  close(closeCode: number = CloseCode.normal, reason = ""): void {
    try {
      this.#conn.close({ closeCode, reason });
    } catch {
      // Already closed.
    }
  }
}

function _address(addr: Deno.NetAddr): string {
  return addr.hostname.includes(":")
    ? `[${addr.hostname}]:${addr.port}`
    : `${addr.hostname}:${addr.port}`;
}

/** Listens for raw (unauthenticated) QUIC connections: building block and benchmark baseline. */
export interface RawListener {
  readonly addr: { hostname: string; port: number };
  /** The next TLS-complete connection; null after `close()`. */
  accept(): Promise<RawConnection | null>;
  /** Stops listening and closes the endpoint with every connection on it. */
  close(): void;
}

/** Starts a raw QUIC listener. */
export function listenQuicRaw(options: QuicServerOptions): RawListener {
  const endpoint = new Deno.QuicEndpoint({
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
  });
  const listener = endpoint.listen({
    cert: options.certificate.certPem,
    key: options.certificate.keyPem,
    alpnProtocols: [ALPN_PROTOCOL],
    ..._transportOptions(options),
  });
  const idle = options.maxIdleTimeoutMs ?? DEFAULT_MAX_IDLE_TIMEOUT_MS;
  const queue = new BoundedQueue<RawConnection>(options.acceptQueueMax ?? 16);
  const tlsMax = options.tlsHandshakesInFlightMax ?? DEFAULT_TLS_HANDSHAKES_IN_FLIGHT_MAX;
  let tlsInFlight = 0;
  const admit = async (incoming: Deno.QuicIncoming) => {
    if (tlsInFlight >= tlsMax) return incoming.refuse();
    tlsInFlight++;
    let conn: Deno.QuicConn;
    try {
      // Accept before reading any address: reading `remoteAddr` first consumes the incoming.
      conn = await incoming.accept();
    } finally {
      tlsInFlight--;
    }
    const raw = new QuicRawConnection(
      conn,
      options.certificate.sha256,
      _address(conn.remoteAddr),
      idle,
    );
    if (!queue.tryPush(raw)) raw.close(CloseCode.normal, "busy: too many connections waiting");
  };
  (async () => {
    try {
      for await (const incoming of listener) admit(incoming).catch(() => {}); // failed TLS: nothing to keep
    } catch {
      // The endpoint was closed.
    }
    queue.close();
  })();
  return {
    addr: { hostname: endpoint.addr.hostname, port: endpoint.addr.port },
    accept: async () => (await queue.shift()) ?? null,
    close: () => {
      queue.close();
      try {
        listener.stop();
        endpoint.close();
      } catch {
        // Already closed.
      }
    },
  };
}

/** Opens a raw (unauthenticated) QUIC connection with the server certificate pinned. */
export async function connectQuicRaw(options: QuicClientOptions): Promise<RawConnection> {
  const v6 = options.hostname.includes(":");
  const endpoint = new Deno.QuicEndpoint({ hostname: v6 ? "::" : "0.0.0.0", port: 0 });
  const idle = options.maxIdleTimeoutMs ?? DEFAULT_MAX_IDLE_TIMEOUT_MS;
  let conn: Deno.QuicConn;
  try {
    conn = await Deno.connectQuic({
      hostname: options.hostname,
      port: options.port,
      alpnProtocols: [ALPN_PROTOCOL],
      endpoint,
      serverCertificateHashes: [{ algorithm: "sha-256", value: options.serverCertificateSha256 }],
      ..._transportOptions(options),
    } as Deno.ConnectQuicOptions<false>);
  } catch (error) {
    endpoint.close();
    const message = (error as Error)?.message ?? String(error);
    throw new PeerError(`Cannot connect to ${options.hostname}:${options.port}: ${message}`, {
      hint: /certificate/i.test(message)
        ? "the peer's TLS certificate is not the pinned one: get its current `identity show --json`"
        : "check that the peer is running and the address and port are right",
      cause: error,
    });
  }
  const raw = new QuicRawConnection(
    conn,
    options.serverCertificateSha256,
    _address({ transport: "udp", hostname: options.hostname, port: options.port }),
    idle,
  );
  // The endpoint is ours alone; release its socket once the connection is over (after a
  // moment, so the close frame still gets out).
  raw.closed.then(() => setTimeout(() => endpoint.close(), 100));
  return raw;
}

/** Accepts authenticated peers. */
export interface PeerListener {
  readonly addr: { hostname: string; port: number };
  /** The next authenticated peer; null after `close()`. */
  accept(): Promise<PeerConnection | null>;
  [Symbol.asyncIterator](): AsyncIterator<PeerConnection>;
  close(): void;
}

/**
 * Listens for peers: every connection is authenticated and has exchanged capabilities before
 * `accept()` returns it. Half-open handshakes are bounded per source and in total, and the
 * least advanced one is evicted for a newcomer (handshake_gate.ts); each server step must come
 * within `handshakeStepMs` (establish.ts). So a flood of openers that send a few bytes and
 * stall cannot lock trusted peers out. Refused, evicted or failed handshakes are reported to
 * `onRefused` (for logs).
 */
export function listenQuic(
  options: QuicServerOptions & PeerOptions & HandshakeGateOptions & {
    onRefused?: (error: Error) => void;
    wrapRaw?: RawConnectionWrapper;
  },
): PeerListener {
  const raw = listenQuicRaw(options);
  const peers = new BoundedQueue<PeerConnection>(options.acceptQueueMax ?? 16);
  const gate = new HandshakeGate(options);
  const handshake = async (connection: RawConnection) => {
    const ticket = gate.admit(sourceOfAddress(connection.remoteAddress), () => {
      connection.close(CloseCode.normal, "busy: evicted a stalled handshake");
    });
    try {
      const peer = await establishPeer(connection, "server", options, {
        progress: () => ticket.progress(),
        authenticated: () => ticket.release(),
      });
      if (!peers.tryPush(peer)) await peer.close();
    } catch (error) {
      options.onRefused?.(
        ticket.evicted
          ? new LimitExceededError(
            `Handshake with ${connection.remoteAddress} evicted for a newer one ` +
              `(handshakesInFlightMax ${gate.handshakesInFlightMax}, ` +
              `handshakesPerSourceMax ${gate.handshakesPerSourceMax})`,
            { hint: "many stalled handshakes: a flood, or peers too slow for handshakeStepMs" },
          )
          : error as Error,
      );
    } finally {
      ticket.release();
    }
  };
  (async () => {
    for (;;) {
      const connection = await raw.accept();
      if (connection === null) break;
      handshake(options.wrapRaw ? options.wrapRaw(connection) : connection);
    }
    peers.close();
  })();
  return {
    addr: raw.addr,
    accept: async () => (await peers.shift()) ?? null,
    async *[Symbol.asyncIterator]() {
      for (;;) {
        const peer = await peers.shift();
        if (peer === undefined) return;
        yield peer;
      }
    },
    close: () => raw.close(),
  };
}

/** Connects to a peer and authenticates it (and this node to it). */
export async function connectQuic(
  options: QuicClientOptions & PeerOptions & {
    expectedServerNodeId?: string;
    wrapRaw?: RawConnectionWrapper;
  },
): Promise<PeerConnection> {
  const raw = await connectQuicRaw(options);
  return await establishPeer(options.wrapRaw ? options.wrapRaw(raw) : raw, "client", options);
}
