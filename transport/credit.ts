/**
 * Credit-based flow control for a handoff stream.
 *
 * The receiver (decoder) grants bytes it has agreed to stage; the sender (prefiller) never
 * has more than that in flight. Grants are cumulative totals ("you may have sent 96 MiB in
 * all"), not increments, so a lost or reordered grant cannot inflate the window and the
 * sender needs no round trip per page: the receiver tops the window up whenever a quarter of
 * it (by default) has been released, while the sender keeps streaming into the rest.
 *
 * Credit counts whole frames on the wire (prefix + header + payload) after the stream's
 * opening frame, so "bytes in flight" bounds receiver memory exactly. One frame may take at
 * most half the window (see `release()` for why).
 *
 * Both classes are pure bookkeeping; handoff_stream.ts moves the grants over the wire.
 */
import { assert, LimitExceededError, ProtocolError } from "../core/errors.ts";

/** Default receiver window: bytes the decoder will stage per handoff stream. */
export const DEFAULT_INFLIGHT_BYTES_MAX = 64 * 1024 * 1024;

/** Sender side: waits for credit before each frame. */
export class CreditSender {
  #grantedTotal = 0;
  #sentTotal = 0;
  #windowBytes = 0;
  #waiter: { bytes: number; resolve: () => void; reject: (e: unknown) => void } | null = null;
  #failure: unknown = undefined;

  /** Cumulative bytes the receiver allows. */
  get grantedBytesTotal(): number {
    return this.#grantedTotal;
  }

  /** Cumulative bytes acquired (sent or being sent). */
  get sentBytesTotal(): number {
    return this.#sentTotal;
  }

  /** The receiver's window, learned from its first grant (0 before it). */
  get windowBytes(): number {
    return this.#windowBytes;
  }

  /** Applies a cumulative grant from the receiver. Throws ProtocolError if it went backwards. */
  grant(grantedBytesTotal: number): void {
    if (!Number.isSafeInteger(grantedBytesTotal) || grantedBytesTotal < this.#grantedTotal) {
      throw new ProtocolError(
        `Peer sent an invalid transfer credit: ${grantedBytesTotal} after ${this.#grantedTotal}`,
      );
    }
    if (this.#windowBytes === 0) this.#windowBytes = grantedBytesTotal;
    this.#grantedTotal = grantedBytesTotal;
    const waiter = this.#waiter;
    if (waiter && this.#sentTotal + waiter.bytes <= this.#grantedTotal) {
      this.#waiter = null;
      this.#sentTotal += waiter.bytes;
      waiter.resolve();
    }
  }

  /**
   * Waits until `bytes` more fit in the granted credit, then counts them as sent.
   * One caller at a time (the handoff stream serializes frames).
   */
  acquire(bytes: number): Promise<void> {
    assert(this.#waiter === null, "concurrent CreditSender.acquire()");
    assert(Number.isSafeInteger(bytes) && bytes >= 0, "credit must be a non-negative integer");
    if (this.#failure !== undefined) return Promise.reject(this.#failure);
    // Frames up to half the window keep the stepped top-ups of CreditReceiver deadlock-free.
    if (this.#windowBytes > 0 && bytes * 2 > this.#windowBytes) {
      return Promise.reject(
        new LimitExceededError(
          `Cannot send a frame of ${bytes} bytes: frames may take at most half the peer's ` +
            `credit window of ${this.#windowBytes} bytes`,
          { hint: "send smaller pages, or raise inflightBytesMax on the receiving node" },
        ),
      );
    }
    if (this.#sentTotal + bytes <= this.#grantedTotal) {
      this.#sentTotal += bytes;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      this.#waiter = { bytes, resolve, reject };
    });
  }

  /** Ends the flow: the pending and every later `acquire()` reject with `error`. */
  fail(error: unknown): void {
    if (this.#failure !== undefined) return;
    this.#failure = error;
    const waiter = this.#waiter;
    this.#waiter = null;
    waiter?.reject(error);
  }
}

/** Receiver side: decides when to grant more, and checks the sender stayed within credit. */
export class CreditReceiver {
  readonly inflightBytesMax: number;
  readonly grantStepBytes: number;
  #grantedTotal = 0;
  #receivedTotal = 0;
  #releasedTotal = 0;

  constructor(options: { inflightBytesMax?: number; grantStepBytes?: number } = {}) {
    this.inflightBytesMax = options.inflightBytesMax ?? DEFAULT_INFLIGHT_BYTES_MAX;
    this.grantStepBytes = options.grantStepBytes ??
      Math.max(1, Math.floor(this.inflightBytesMax / 4));
    assert(this.inflightBytesMax > 0 && this.grantStepBytes > 0, "credit window must be positive");
    assert(
      this.grantStepBytes * 2 <= this.inflightBytesMax,
      "grantStepBytes must be at most half the window",
    );
  }

  /** Bytes received but not yet released by the consumer. */
  get stagedBytes(): number {
    return this.#receivedTotal - this.#releasedTotal;
  }

  get grantedBytesTotal(): number {
    return this.#grantedTotal;
  }

  /** The first grant: the whole window. */
  initialGrant(): number {
    assert(this.#grantedTotal === 0, "initialGrant() called twice");
    this.#grantedTotal = this.inflightBytesMax;
    return this.#grantedTotal;
  }

  /** Counts a received frame. Throws ProtocolError if the sender overran its credit. */
  onReceived(bytes: number): void {
    this.#receivedTotal += bytes;
    if (this.#receivedTotal > this.#grantedTotal) {
      throw new ProtocolError(
        `Peer overran its transfer credit: ${this.#receivedTotal} bytes received, ${this.#grantedTotal} granted`,
        { hint: "the peer ignores flow control: upgrade it to the same skippy-disagg version" },
      );
    }
  }

  /**
   * The consumer is done with `bytes` (staged elsewhere or dropped). Returns the new
   * cumulative grant to send, or null when the top-up is still too small to be worth a frame.
   */
  release(bytes: number): number | null {
    this.#releasedTotal += bytes;
    assert(this.#releasedTotal <= this.#receivedTotal, "released more bytes than were received");
    const target = this.#releasedTotal + this.inflightBytesMax;
    // Top up in steps, not per frame. This cannot starve a blocked sender: a blocked frame
    // needs more than the unused credit, frames are at most half the window, and a step is at
    // most half the window, so once its predecessors are released the top-up reaches a step.
    if (target - this.#grantedTotal < this.grantStepBytes) return null;
    this.#grantedTotal = target;
    return target;
  }
}
