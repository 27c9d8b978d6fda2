/**
 * PeerConnection: an authenticated connection to one peer, on any RawConnection (QUIC or the
 * loopback fake). It owns the control stream (framed msgpack messages, both directions) and
 * the handoff streams (one bidirectional stream per transfer, see handoff_stream.ts).
 *
 * Establishment, on the first bidirectional stream (which becomes the control stream):
 * authentication (auth.ts), then one CapabilitiesOffer each way (capabilities.ts), all
 * bounded by `handshakeTimeoutMs`. After that, every further stream the peer opens must start
 * with HandoffStreamOpen within `handshakeStepMs`; anything else is refused and closed at
 * once (_incoming_streams.ts), which leaves room for new stream types. An opened handoff
 * stream gets no credit until the caller has matched it to a reservation
 * (`acceptHandoffStream()`, then `accept()`).
 *
 * Closing: `close()` sends a final ConnectionClosing frame; the peer answers with its own; the
 * side that receives the answer (and so knows every byte both ways arrived) closes the QUIC
 * connection. `writer.close()` resolving proves nothing on Deno QUIC, hence the exchange.
 * A peer that goes silent is noticed through the idle timeout: `closed` resolves with
 * `timedOut`, and pending receives reject instead of hanging.
 */
import {
  assert,
  HandoffAbortedError,
  PeerError,
  ProtocolError,
  SkippyError,
} from "../core/errors.ts";
import { BoundedQueue } from "../core/queue.ts";
import type { AuthenticatedPeer } from "./auth.ts";
import type { Capabilities } from "./capabilities.ts";
import { describeEnd, sleep } from "./_connection_end.ts";
import { admitIncomingStreams } from "./_incoming_streams.ts";
import { type ByteChannel, CloseCode, type ConnectionEnd, type RawConnection } from "./channel.ts";
import { DEFAULT_FRAME_LIMITS, type FrameHeader } from "./frame.ts";
import { FrameReader, FrameWriter } from "./framed_stream.ts";
import { HandoffSender, type IncomingHandoffStream } from "./handoff_stream.ts";
import {
  DEFAULT_LINK_PROBE_OPTIONS,
  LINK_PING,
  LINK_PONG,
  type LinkProbeOptions,
  PingTracker,
  type ProbeResult,
  sendProbe,
} from "./link_probe.ts";
import {
  DEFAULT_LOSS_PROBE_OPTIONS,
  LossProbeCounter,
  type LossProbeOptions,
  type LossProbePlan,
  type LossProbeResult,
  sendLossProbe,
} from "./loss_probe.ts";
import {
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_HANDSHAKE_STEP_MS,
  type PeerOptions,
} from "./peer_options.ts";

// The options and their default bounds live in peer_options.ts and stay importable from here.
export * from "./peer_options.ts";

/** Frame types the connection itself uses on the control stream. */
export const CONTROL_STREAM_TYPES = Object.freeze([
  "ClientHello",
  "ServerChallenge",
  "ClientProof",
  "AuthAccepted",
  "AuthRefused",
  "CapabilitiesOffer",
  "ConnectionClosing",
  LINK_PING,
  LINK_PONG,
]);

/** A message on the control stream. */
export interface ControlMessage {
  header: FrameHeader & { type: string };
  payload: Uint8Array;
}

/** An authenticated connection to one peer. Create with `establishPeer` (establish.ts), `connectQuic`, `listenQuic`. */
export class PeerConnection {
  readonly peerNodeId: string;
  readonly peerPublicKey: Uint8Array;
  /** The label of the peer's trust list entry, if any. */
  readonly peerLabel?: string;
  readonly remoteAddress: string;
  /** What the peer announced (unknown or malformed fields dropped). */
  readonly peerCapabilities: Capabilities;
  /** One line per capability field the peer sent malformed. */
  readonly peerCapabilityProblems: string[];
  /** Resolves (never rejects) when the connection has ended. */
  readonly closed: Promise<ConnectionEnd>;

  readonly #raw: RawConnection;
  readonly #reader: FrameReader;
  readonly #writer: FrameWriter;
  readonly #options: PeerOptions;
  readonly #messages: BoundedQueue<ControlMessage>;
  readonly #incoming: BoundedQueue<IncomingHandoffStream>;
  #end: ConnectionEnd | null = null;
  #closing: Promise<void> | null = null;
  readonly #linkProbe: LinkProbeOptions;
  readonly #pings: PingTracker;
  readonly #lossProbe: LossProbeOptions;
  /** Counts the loss probe's datagrams; null without datagrams on this connection. */
  readonly #lossCounter: LossProbeCounter | null;

  /** Use `establishPeer()`. */
  constructor(
    raw: RawConnection,
    reader: FrameReader,
    writer: FrameWriter,
    peer: AuthenticatedPeer,
    capabilities: { capabilities: Capabilities; problems: string[] },
    options: PeerOptions,
  ) {
    this.#raw = raw;
    this.#reader = reader;
    this.#writer = writer;
    this.#options = options;
    this.peerNodeId = peer.nodeId;
    this.peerPublicKey = peer.publicKey;
    this.peerLabel = peer.label;
    this.remoteAddress = raw.remoteAddress;
    this.peerCapabilities = capabilities.capabilities;
    this.peerCapabilityProblems = capabilities.problems;
    this.#messages = new BoundedQueue(options.controlQueueMessagesMax ?? 64);
    this.#incoming = new BoundedQueue(options.incomingHandoffStreamsMax ?? 16);
    this.#linkProbe = { ...DEFAULT_LINK_PROBE_OPTIONS, ...options.linkProbe };
    this.#pings = new PingTracker((h) => this.#writer.write(h), this.#linkProbe);
    this.#lossProbe = { ...DEFAULT_LOSS_PROBE_OPTIONS, ...options.lossProbe };
    this.#lossCounter = raw.datagrams ? new LossProbeCounter() : null;
    this.closed = raw.closed.then((end) => {
      this.#end = end;
      this.#pings.end();
      return end;
    });
    this.#pumpControl();
    admitIncomingStreams(raw, {
      frame: (channel) => this.#handoffIo(channel),
      stepMs: options.handshakeStepMs ?? DEFAULT_HANDSHAKE_STEP_MS,
      handoff: options.handoff,
      incoming: this.#incoming,
      linkProbe: this.#linkProbe,
      lossProbe: this.#lossProbe,
      lossCounter: this.#lossCounter,
    });
    this.#pumpDatagrams();
  }

  /** Sends a control message (`header.type` must not be a reserved transport type). */
  async send(header: FrameHeader, payload?: Uint8Array): Promise<void> {
    assert(typeof header.type === "string", "control message header needs a string type");
    assert(!CONTROL_STREAM_TYPES.includes(header.type), `"${header.type}" is reserved`);
    if (this.#closing || this.#writer.finalQueued) {
      throw new PeerError(`Connection to peer ${this.peerNodeId} is closing`);
    }
    try {
      await this.#writer.write(header, payload);
    } catch (error) {
      if (error instanceof SkippyError) throw error;
      const how = this.#describeEnd(this.#end, error);
      throw new PeerError(
        `Connection to peer ${this.peerNodeId} at ${this.remoteAddress} lost: ${how}`,
        { cause: error },
      );
    }
  }

  /**
   * The next control message; null once the peer closed normally. Rejects with PeerError if
   * the connection was lost (including a dead peer, after the idle timeout), with
   * ProtocolError/FrameError if the peer sent something malformed.
   */
  async receive(): Promise<ControlMessage | null> {
    return (await this.#messages.shift()) ?? null;
  }

  /** Iterates control messages until the peer closes. */
  async *[Symbol.asyncIterator](): AsyncIterator<ControlMessage> {
    for (;;) {
      const message = await this.receive();
      if (message === null) return;
      yield message;
    }
  }

  /** Whether the peer answers link pings and probes (it advertised `linkProbeVersion`). */
  get supportsLinkProbe(): boolean {
    return (this.peerCapabilities.linkProbeVersion ?? 0) >= 1;
  }

  /**
   * Whether a loss probe can run: the peer answers it (`linkProbeVersion` 2) and this
   * connection carries datagrams.
   */
  get supportsLossProbe(): boolean {
    return (this.peerCapabilities.linkProbeVersion ?? 0) >= 2 && this.#raw.datagrams !== undefined;
  }

  /** Largest datagram this connection sends (0: none). */
  get datagramBytesMax(): number {
    return this.#raw.datagrams?.maxBytes ?? 0;
  }

  /**
   * Sends a loss probe (loss_probe.ts): `plan.datagrams` datagrams at `plan.bytesPerS`, on a
   * stream of its own; resolves with the share the peer did not receive.
   */
  async probeLoss(plan: LossProbePlan): Promise<LossProbeResult> {
    const port = this.#raw.datagrams;
    if (!this.supportsLossProbe || !port) {
      throw new PeerError(
        `Peer ${this.peerNodeId} cannot be probed for loss (an older build, or no datagrams on this connection)`,
      );
    }
    const { reader, writer } = await this.#probeStream();
    return await sendLossProbe(reader, writer, port, plan, this.#lossProbe);
  }

  /**
   * One control-stream round trip in ms; null when the ping was lost (no answer within
   * `pingTimeoutMs`). One ping is in flight at a time and pings are spaced by
   * `pingIntervalMsMin`. Throws PeerError for a peer that does not support it.
   */
  ping(): Promise<number | null> {
    if (!this.supportsLinkProbe) {
      return Promise.reject(
        new PeerError(`Peer ${this.peerNodeId} does not answer link pings (older build)`),
      );
    }
    return this.#pings.ping();
  }

  /** Sends a bandwidth probe of `bytes` (bounded by `probeBytesMax`) on a stream of its own. */
  async probeBandwidth(bytes: number): Promise<ProbeResult> {
    if (!this.supportsLinkProbe) {
      throw new PeerError(`Peer ${this.peerNodeId} does not answer link probes (older build)`);
    }
    const { reader, writer } = await this.#probeStream();
    return await sendProbe(reader, writer, bytes, this.#linkProbe);
  }

  /** A new stream of its own for a probe, framed as a handoff stream is. */
  async #probeStream(): Promise<{ reader: FrameReader; writer: FrameWriter }> {
    try {
      return this.#handoffIo(await this.#raw.openChannel());
    } catch (error) {
      throw this.#handoffError(error);
    }
  }

  /** Opens a handoff stream whose opening frame carries `meta` (e.g. the handoff id). */
  async openHandoffStream(meta: FrameHeader = {}): Promise<HandoffSender> {
    let channel: ByteChannel;
    try {
      channel = await this.#raw.openChannel();
    } catch (error) {
      throw this.#handoffError(error);
    }
    const { reader, writer } = this.#handoffIo(channel);
    return new HandoffSender(reader, writer, meta, this.#options.handoff);
  }

  /**
   * The next handoff stream the peer opened, not yet granted any credit; null once the
   * connection has ended. Match its `meta` to a live reservation of this peer, then call
   * `accept()` (credit starts flowing) or `refuse()` (the stream is closed at once).
   */
  async acceptHandoffStream(): Promise<IncomingHandoffStream | null> {
    return (await this.#incoming.shift()) ?? null;
  }

  /** Iterates incoming handoff streams (each to accept or refuse) until the connection ends. */
  async *incomingHandoffStreams(): AsyncIterable<IncomingHandoffStream> {
    for (;;) {
      const stream = await this.acceptHandoffStream();
      if (stream === null) return;
      yield stream;
    }
  }

  /** Closes gracefully (see the file comment); bounded by `closeTimeoutMs`. */
  close(): Promise<void> {
    this.#closing ??= this.#closeGracefully();
    return this.#closing;
  }

  async #closeGracefully(): Promise<void> {
    await this.#sendClosing();
    await this.closed;
  }

  /**
   * Sends ConnectionClosing as the last control frame, then waits for the connection to end
   * and closes it if it has not within `closeTimeoutMs`. Whoever receives the other side's
   * ConnectionClosing after sending its own closes the connection: the control pump when this
   * side closed first, the peer when this is the answer.
   */
  async #sendClosing(): Promise<void> {
    if (!this.#writer.finalQueued) {
      await this.#writer.write({ type: "ConnectionClosing" }, undefined, { final: true }).catch(
        () => {},
      );
    }
    await this.#writer.close();
    await Promise.race([
      this.closed,
      sleep(this.#options.closeTimeoutMs ?? DEFAULT_CLOSE_TIMEOUT_MS),
    ]);
    this.#raw.close(CloseCode.normal, "closed");
  }

  /** Feeds the connection's datagrams to the loss probe's counter until the connection ends. */
  async #pumpDatagrams(): Promise<void> {
    const port = this.#raw.datagrams, counter = this.#lossCounter;
    if (!port || !counter) return;
    for (;;) {
      const d = await port.receive().catch(() => null);
      if (d === null) return;
      counter.onDatagram(d);
    }
  }

  async #pumpControl(): Promise<void> {
    try {
      for (;;) {
        const frame = await this.#reader.read();
        if (frame === null) break;
        if (frame.header.type === "ConnectionClosing") {
          this.#onPeerClosing();
          break;
        }
        if (frame.header.type === LINK_PING) this.#pings.onPing(frame.header);
        if (frame.header.type === LINK_PONG) this.#pings.onPong(frame.header);
        if (frame.header.type === LINK_PING || frame.header.type === LINK_PONG) continue;
        if (
          typeof frame.header.type !== "string" || CONTROL_STREAM_TYPES.includes(frame.header.type)
        ) {
          throw new ProtocolError(
            `Peer ${this.peerNodeId} sent an unexpected "${
              String(frame.header.type)
            }" control frame`,
          );
        }
        const message = {
          header: frame.header as ControlMessage["header"],
          payload: frame.payload,
        };
        if (!await this.#messages.push(message)) break;
      }
      this.#messages.close();
    } catch (error) {
      await this.#onControlError(error);
    }
  }

  #onPeerClosing(): void {
    this.#messages.close();
    if (this.#closing) {
      // Our ConnectionClosing was sent first and this is the answer: everything arrived.
      this.#raw.close(CloseCode.normal, "closed");
      return;
    }
    // Our answer: the peer closes when it arrives, and we do if it never does.
    this.#closing = this.#sendClosing();
  }

  async #onControlError(error: unknown): Promise<void> {
    if (this.#closing) {
      this.#messages.close(); // our own close cut the stream: not an error
      return;
    }
    if (error instanceof SkippyError) {
      this.#messages.fail(error);
      this.#raw.close(CloseCode.protocolError, error.message.slice(0, 120));
      return;
    }
    const end = await Promise.race([this.closed, sleep(200).then(() => null)]);
    const how = this.#describeEnd(end, error);
    this.#messages.fail(
      new PeerError(`Connection to peer ${this.peerNodeId} at ${this.remoteAddress} lost: ${how}`, {
        hint: "the peer's state is unknown: retry or fall back (a handoff in progress is aborted)",
        cause: error,
      }),
    );
  }

  #handoffIo(channel: ByteChannel): { reader: FrameReader; writer: FrameWriter } {
    const limits = this.#options.handoff?.frameLimits ?? DEFAULT_FRAME_LIMITS;
    const mapError = (error: unknown) => this.#handoffError(error);
    return {
      reader: new FrameReader(channel.readable, { limits, mapError }),
      writer: new FrameWriter(channel.writable, { limits, mapError }),
    };
  }

  #handoffError(error: unknown): Error {
    if (error instanceof SkippyError) return error;
    const how = this.#describeEnd(this.#end, error);
    return new HandoffAbortedError(
      "connection-lost",
      `Handoff stream to peer ${this.peerNodeId} lost: ${how}`,
      { hint: "the transfer is incomplete: retry or fall back", cause: error },
    );
  }

  /** How the connection ended (`end`, null while unknown), else the failed call's `error`. */
  #describeEnd(end: ConnectionEnd | null, error: unknown): string {
    return describeEnd(
      this.remoteAddress,
      end,
      this.#raw.maxIdleTimeoutMs,
      (error as Error)?.message,
    );
  }
}
