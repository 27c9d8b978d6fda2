/**
 * A handoff stream: one dedicated bidirectional stream per transfer, separate from the
 * control stream, carrying frames one way and credit the other.
 *
 *   sender -> receiver   HandoffStreamOpen { meta }            (first; makes the stream visible)
 *   receiver -> sender   TransferCredit { grantedBytesTotal }  (when the receiver has matched
 *                                                               the stream to a reservation
 *                                                               and accepted it; then whenever
 *                                                               a step is released)
 *   sender -> receiver   <caller frames>...                    (each waits for credit)
 *   sender -> receiver   <last caller frame> | HandoffStreamEnd (final flag set)
 *   receiver -> sender   HandoffStreamReceived { frames, wireBytes }  (final: the receipt)
 *
 * Either side may instead end its direction with a final HandoffStreamAborted { reason };
 * the receiver may answer the opening with a final HandoffStreamRefused { reason }.
 * Open and Aborted frames are not counted against credit, so an abort always gets through.
 *
 * Ownership: frames returned by `receive()` belong to the caller; their bytes count as staged
 * until released (automatically at the next `receive()`, or by `release()` with
 * `manualRelease`), and only released bytes are granted back to the sender.
 */
import {
  assert,
  HandoffAbortedError,
  LimitExceededError,
  PeerError,
  ProtocolError,
} from "../core/errors.ts";
import { CreditReceiver, CreditSender, DEFAULT_INFLIGHT_BYTES_MAX } from "./credit.ts";
import type { Frame, FrameHeader, FrameLimits } from "./frame.ts";
import type { FrameReader, FrameWriter } from "./framed_stream.ts";

/** Frame types the handoff stream itself uses; caller frames must not reuse them. */
export const HANDOFF_STREAM_TYPES = Object.freeze([
  "HandoffStreamOpen",
  "TransferCredit",
  "HandoffStreamEnd",
  "HandoffStreamReceived",
  "HandoffStreamAborted",
  "HandoffStreamRefused",
]);

/** Bounds for handoff streams. */
export interface HandoffStreamOptions {
  frameLimits?: FrameLimits;
  /** Receiver: bytes it will stage per stream (the credit window). */
  inflightBytesMax?: number;
  /** Receiver: release at least this much before sending a new grant. */
  grantStepBytes?: number;
  /** Sender: how long `finish()` waits for the receipt after the final frame. */
  receiptTimeoutMs?: number;
  /**
   * Sender: after a failed write, how long to wait for the receiver's own reason (its abort
   * frame) before reporting the write's error. A receiver that aborts writes its reason first
   * and only then stops the sender's direction, so the reason is already on its way.
   */
  abortReasonWaitMs?: number;
}

export const DEFAULT_RECEIPT_TIMEOUT_MS = 30_000;
export const DEFAULT_ABORT_REASON_WAIT_MS = 500;

/** What the receiver confirmed it read. */
export interface HandoffReceipt {
  frames: number;
  wireBytes: number;
}

function _assertCallerType(header: FrameHeader): void {
  assert(typeof header.type === "string", "handoff frame header needs a string type");
  assert(!HANDOFF_STREAM_TYPES.includes(header.type as string), `"${header.type}" is reserved`);
}

function _abortError(who: string, header: FrameHeader): HandoffAbortedError {
  const reason = typeof header.reason === "string" ? header.reason.slice(0, 200) : "unspecified";
  return new HandoffAbortedError(
    `${who}-aborted`,
    `Handoff stream aborted by the ${who}: ${reason}`,
  );
}

/** The sending side of a handoff stream (the side that opened it). */
export class HandoffSender {
  readonly meta: FrameHeader;
  readonly #reader: FrameReader;
  readonly #writer: FrameWriter;
  readonly #credit = new CreditSender();
  readonly #receipt: Promise<HandoffReceipt>;
  readonly #receiptTimeoutMs: number;
  readonly #abortReasonWaitMs: number;
  #tail: Promise<unknown> = Promise.resolve();

  /** Use `PeerConnection.openHandoffStream()`. Writes the opening frame. */
  constructor(
    reader: FrameReader,
    writer: FrameWriter,
    meta: FrameHeader,
    options: HandoffStreamOptions = {},
  ) {
    this.meta = meta;
    this.#reader = reader;
    this.#writer = writer;
    this.#receiptTimeoutMs = options.receiptTimeoutMs ?? DEFAULT_RECEIPT_TIMEOUT_MS;
    this.#abortReasonWaitMs = options.abortReasonWaitMs ?? DEFAULT_ABORT_REASON_WAIT_MS;
    writer.write({ type: "HandoffStreamOpen", meta }).catch((e) => this.#credit.fail(e));
    this.#receipt = this.#pumpCredit();
    this.#receipt.catch(() => {}); // observed by finish(); never an unhandled rejection
  }

  /** Cumulative bytes the receiver has granted, and bytes sent against them. */
  get credit(): { grantedBytesTotal: number; sentBytesTotal: number } {
    return {
      grantedBytesTotal: this.#credit.grantedBytesTotal,
      sentBytesTotal: this.#credit.sentBytesTotal,
    };
  }

  /**
   * Sends one frame once credit allows. Calls may overlap; frames keep call order. With
   * `payloadChecked: false` the payload carries its own checksum that the receiver verifies
   * (state chunks), so the frame CRC leaves it out.
   */
  send(
    header: FrameHeader,
    payload?: Uint8Array,
    options: { payloadChecked?: boolean } = {},
  ): Promise<void> {
    _assertCallerType(header);
    return this.#sendEncoded(header, payload, false, options.payloadChecked);
  }

  /**
   * Sends the final frame (the given one, or HandoffStreamEnd) and waits for the receiver's
   * receipt: only that proves the bytes arrived. Bounded by `receiptTimeoutMs`.
   */
  async finish(
    header: FrameHeader = { type: "HandoffStreamEnd" },
    payload?: Uint8Array,
  ): Promise<HandoffReceipt> {
    if (header.type !== "HandoffStreamEnd") _assertCallerType(header);
    await this.#sendEncoded(header, payload, true);
    await this.#writer.close().catch((error) => this.#failWrite(error));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(
          new LimitExceededError(
            `No handoff stream receipt within receiptTimeoutMs (${this.#receiptTimeoutMs} ms)`,
            {
              hint: "the receiver is stalled or the link is too slow; raise receiptTimeoutMs",
            },
          ),
        );
      }, this.#receiptTimeoutMs);
    });
    try {
      return await Promise.race([this.#receipt, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Ends the stream with an abort notice the receiver sees as HandoffAbortedError. */
  async abort(reason: string): Promise<void> {
    this.#credit.fail(
      new HandoffAbortedError("sender-aborted", `Handoff stream aborted by this node: ${reason}`),
    );
    if (!this.#writer.finalQueued) {
      await this.#writer.write({ type: "HandoffStreamAborted", reason }, undefined, { final: true })
        .catch(() => {});
    }
    await this.#writer.close();
    this.#reader.cancel();
  }

  #sendEncoded(
    header: FrameHeader,
    payload: Uint8Array | undefined,
    final: boolean,
    payloadChecked = true,
  ): Promise<void> {
    const frame = this.#writer.encode(header, payload, { final, payloadChecked });
    // Credit is acquired in call order, so overlapping sends cannot reorder frames.
    const run = async () => {
      await this.#credit.acquire(frame.wireBytes);
      await this.#writer.writeEncoded(frame).catch((error) => this.#failWrite(error));
    };
    const result = this.#tail.then(run);
    this.#tail = result.catch(() => {});
    return result;
  }

  /**
   * A write failed: the connection may be gone, or the receiver aborted the stream and its
   * stop overtook the reason it wrote before it (the reader had not read it yet). Rethrows the
   * receiver's abort or refusal when it arrives within `abortReasonWaitMs`, else `error`.
   */
  async #failWrite(error: unknown): Promise<never> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const waited = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, this.#abortReasonWaitMs);
    });
    try {
      await Promise.race([this.#receipt, waited]);
    } catch (reason) {
      const aborted = reason instanceof HandoffAbortedError && reason.reason === "receiver-aborted";
      if (aborted || reason instanceof PeerError) throw reason;
    } finally {
      clearTimeout(timer);
    }
    throw error;
  }

  /** Reads the receiver's direction: grants, then the receipt (or an abort). */
  async #pumpCredit(): Promise<HandoffReceipt> {
    try {
      for (;;) {
        const frame = await this.#reader.read();
        if (frame === null) throw new ProtocolError("Handoff stream ended without a receipt");
        const h = frame.header;
        if (h.type === "TransferCredit" && !frame.final) {
          this.#credit.grant(Number(h.grantedBytesTotal));
        } else if (h.type === "HandoffStreamReceived" && frame.final) {
          return { frames: Number(h.frames), wireBytes: Number(h.wireBytes) };
        } else if (h.type === "HandoffStreamAborted") throw _abortError("receiver", h);
        else if (h.type === "HandoffStreamRefused") {
          throw new PeerError(
            `Peer refused the handoff stream: ${String(h.reason).slice(0, 200)}`,
            {
              hint: "the peer has no live reservation for this stream, or too many pending streams",
            },
          );
        } else {throw new ProtocolError(
            `Unexpected "${String(h.type)}" frame from a handoff stream receiver`,
          );}
      }
    } catch (error) {
      this.#credit.fail(error);
      throw error;
    }
  }
}

/**
 * A handoff stream the peer opened, before the receiver decided on it: nothing granted,
 * nothing read past the opening frame. The receiver matches `meta` (e.g. the handoff id and
 * attempt) to a live reservation of the authenticated peer, then either `accept()`s it, which
 * grants the first credit window, or `refuse()`s it, which closes it at once.
 */
export class IncomingHandoffStream {
  readonly meta: FrameHeader;
  readonly #reader: FrameReader;
  readonly #writer: FrameWriter;
  readonly #options: HandoffStreamOptions & { manualRelease?: boolean };
  #decided = false;

  /** Use `PeerConnection.acceptHandoffStream()`; `meta` is from the opening frame. */
  constructor(
    reader: FrameReader,
    writer: FrameWriter,
    meta: FrameHeader,
    options: HandoffStreamOptions & { manualRelease?: boolean } = {},
  ) {
    this.meta = meta;
    this.#reader = reader;
    this.#writer = writer;
    this.#options = options;
  }

  /** Whether `accept()` or `refuse()` was called. */
  get decided(): boolean {
    return this.#decided;
  }

  /** Takes the stream: the first credit window goes to the sender now. Once only. */
  accept(): HandoffReceiver {
    assert(!this.#decided, "accept() after accept() or refuse()");
    this.#decided = true;
    const receiver = new HandoffReceiver(this.#reader, this.#writer, this.meta, this.#options);
    receiver.start();
    return receiver;
  }

  /** Refuses the stream (the sender sees PeerError with `reason`) and closes it. */
  async refuse(reason: string): Promise<void> {
    if (this.#decided) return;
    this.#decided = true;
    this.#reader.cancel();
    await this.#writer.write({ type: "HandoffStreamRefused", reason }, undefined, { final: true })
      .catch(() => {});
    await this.#writer.close();
  }
}

/** The receiving side of a handoff stream (from `IncomingHandoffStream.accept()`). */
export class HandoffReceiver {
  readonly meta: FrameHeader;
  readonly #reader: FrameReader;
  readonly #writer: FrameWriter;
  readonly #credit: CreditReceiver;
  readonly #manualRelease: boolean;
  #started = false;
  #unreleased: Frame | null = null;
  #frames = 0;
  #wireBytes = 0;
  #done = false;

  /** Use `IncomingHandoffStream.accept()`. */
  constructor(
    reader: FrameReader,
    writer: FrameWriter,
    meta: FrameHeader,
    options: HandoffStreamOptions & { manualRelease?: boolean } = {},
  ) {
    this.meta = meta;
    this.#reader = reader;
    this.#writer = writer;
    this.#manualRelease = options.manualRelease ?? false;
    this.#credit = new CreditReceiver({
      inflightBytesMax: options.inflightBytesMax ?? DEFAULT_INFLIGHT_BYTES_MAX,
      grantStepBytes: options.grantStepBytes,
    });
  }

  /** Bytes received and not yet released. */
  get stagedBytes(): number {
    return this.#credit.stagedBytes;
  }

  /** Grants the first window. Until then the sender can send nothing but its opening frame. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    this.#grant(this.#credit.initialGrant());
  }

  /**
   * The next caller frame (the last one has `final: true`), or null after it. Throws
   * HandoffAbortedError if the sender aborted or the connection was lost, FrameError if the
   * stream was cut or corrupted.
   */
  async receive(): Promise<Frame | null> {
    this.start();
    if (this.#unreleased && !this.#manualRelease) this.release(this.#unreleased);
    if (this.#done) return null;
    const frame = await this.#reader.read();
    if (frame === null) {
      this.#done = true;
      return null;
    }
    if (frame.header.type === "HandoffStreamAborted") {
      this.#done = true;
      throw _abortError("sender", frame.header);
    }
    this.#credit.onReceived(frame.wireBytes);
    this.#frames++;
    this.#wireBytes += frame.wireBytes;
    this.#unreleased = frame;
    if (frame.final) {
      this.#done = true;
      // The receipt proves delivery to the sender, which must not trust writer.close().
      const receipt = {
        type: "HandoffStreamReceived",
        frames: this.#frames,
        wireBytes: this.#wireBytes,
      };
      await this.#writer.write(receipt, undefined, { final: true }).catch(() => {});
      await this.#writer.close();
    }
    return frame;
  }

  /** Marks a received frame's bytes as no longer staged (only with `manualRelease`). */
  release(frame: Frame): void {
    if (this.#unreleased === frame) this.#unreleased = null;
    const grant = this.#credit.release(frame.wireBytes);
    if (grant !== null && !this.#done) this.#grant(grant);
  }

  /** Iterates caller frames until the final one. */
  async *[Symbol.asyncIterator](): AsyncIterator<Frame> {
    for (;;) {
      const frame = await this.receive();
      if (frame === null) return;
      yield frame;
    }
  }

  /** Tells the sender to stop (it sees HandoffAbortedError) and drops the stream. */
  async abort(reason: string): Promise<void> {
    this.#done = true;
    if (!this.#writer.finalQueued) {
      await this.#writer.write({ type: "HandoffStreamAborted", reason }, undefined, { final: true })
        .catch(() => {});
    }
    await this.#writer.close();
    this.#reader.cancel();
  }

  #grant(grantedBytesTotal: number): void {
    // Grant failures surface on the next receive() as the connection error; nothing to do here.
    this.#writer.write({ type: "TransferCredit", grantedBytesTotal }).catch(() => {});
  }
}
