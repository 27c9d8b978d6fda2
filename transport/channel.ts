/**
 * The two interfaces every link implements, below authentication: a byte channel (one QUIC
 * bidirectional stream, or its in-memory fake) and a raw connection that carries them.
 * Everything above (framing, authentication, capabilities, credit, PeerConnection) is written
 * once against these, so the real QUIC transport and the loopback fake run the same protocol
 * code and the conformance suite can test both.
 */

/** A bidirectional byte stream. A clean end of `readable` proves nothing: see frame.ts. */
export interface ByteChannel {
  readonly readable: ReadableStream<Uint8Array>;
  readonly writable: WritableStream<Uint8Array>;
}

/** Why a connection ended. */
export interface ConnectionEnd {
  /** The application close code (0 for a normal close or a local close). */
  closeCode: number;
  reason: string;
  /** True when the connection died because the peer went silent (idle timeout). */
  timedOut: boolean;
}

/** Close codes this product sends. Numbers are part of the protocol: only ever append. */
export const CloseCode = Object.freeze({
  normal: 0,
  authenticationFailed: 1,
  protocolError: 2,
  handshakeTimeout: 3,
  faultInjected: 0x1f,
});

/**
 * Unreliable datagrams on a connection (QUIC DATAGRAM frames): never retransmitted, so what
 * the link loses stays lost. Used only to measure loss (loss_probe.ts).
 */
export interface DatagramPort {
  /** Largest datagram the connection can send now (bytes). */
  readonly maxBytes: number;
  /** Queues one datagram of at most `maxBytes`; rejects once the connection has ended. */
  send(data: Uint8Array): Promise<void>;
  /** The next datagram received; null once the connection has ended. */
  receive(): Promise<Uint8Array | null>;
}

/** A connection before authentication: QUIC (quic.ts) or the loopback fake (loopback.ts). */
export interface RawConnection {
  /** Opens a bidirectional channel. The peer sees it only after the first byte is written. */
  openChannel(): Promise<ByteChannel>;
  /** The next channel the peer opened, in order; null once the connection has ended. */
  acceptChannel(): Promise<ByteChannel | null>;
  /** Ends the connection now; unsent data may be lost (wait for an acknowledgement first). */
  close(closeCode?: number, reason?: string): void;
  /** Resolves (never rejects) when the connection has ended, however it ended. */
  readonly closed: Promise<ConnectionEnd>;
  /**
   * SHA-256 of the server's TLS certificate (DER): on the client, the value it pinned; on the
   * server, its own. Authentication signs it, binding node identity to this TLS session.
   */
  readonly serverCertificateSha256: Uint8Array;
  /** The peer's address, for messages ("127.0.0.1:4433"). */
  readonly remoteAddress: string;
  /** The idle timeout in force (ms): how long a silent peer takes to be declared dead. */
  readonly maxIdleTimeoutMs: number;
  /** Its datagrams; absent where the transport or the peer has none. */
  readonly datagrams?: DatagramPort;
}
