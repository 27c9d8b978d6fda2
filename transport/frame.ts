/**
 * Framing: how every byte on a skippy-disagg stream is cut into messages.
 *
 * Wire layout of one frame (all integers big-endian):
 *
 * | offset | bytes | field                                                         |
 * |-------:|------:|---------------------------------------------------------------|
 * |      0 |     2 | magic `0x53 0x44` ("SD")                                      |
 * |      2 |     1 | version (`FRAME_VERSION`)                                     |
 * |      3 |     1 | flags: bit 0 final frame of this stream direction; bit 1     |
 * |        |       | payload not covered by the CRC (it carries its own checksum);  |
 * |        |       | the rest 0                                                    |
 * |      4 |     4 | header length in bytes (>= 1)                                 |
 * |      8 |     4 | payload length in bytes (>= 0)                                |
 * |     12 |     4 | CRC32C over bytes 0..11, then the header, then the payload    |
 * |     16 |     h | header: one msgpack map                                       |
 * |   16+h |     p | payload: raw bytes, never copied into the header buffer       |
 *
 * Why each part exists: Deno's QUIC `writer.abort()` ends a stream exactly like `close()`,
 * and there is no stream reset with a code, so a cut-off transfer looks complete at the byte
 * level. Completeness is therefore proven by the framing alone: explicit lengths find a cut
 * mid-frame, the final flag finds a cut between frames, and the checksum finds corruption or
 * splicing. The version byte lets a later build refuse (not misparse) an older peer.
 *
 * Bit 1 exists for bulk state: a StateChunk's payload already carries a checksum in its
 * (tagged) header, verified by the consumer, so covering it here too would read every byte
 * of state twice more per handoff. Such a frame's CRC covers prefix and header only; the
 * payload's integrity in transit is QUIC's AEAD, end to end the consumer's checksum.
 *
 * Changelog of FRAME_VERSION:
 * 1. First version.
 */
import { assert, LimitExceededError, ProtocolError } from "../core/errors.ts";
import { crc32c } from "../core/crc32c.ts";
import { packMsgpack, unpackMsgpack } from "./_msgpack.ts";

export const FRAME_MAGIC = 0x5344;
export const FRAME_VERSION = 1;
/** Bytes before the header: magic, version, flags, two lengths and the checksum. */
export const FRAME_PREFIX_BYTES = 16;
const FLAG_FINAL = 0x01;
const FLAG_PAYLOAD_UNCHECKED = 0x02;
const CHECKED_PREFIX_BYTES = 12;
const EMPTY = new Uint8Array(0);

/** Hard ceilings, checked before any buffer is allocated for an incoming frame. */
export interface FrameLimits {
  /** Largest msgpack header accepted or sent. */
  headerBytesMax: number;
  /** Largest payload accepted or sent. */
  payloadBytesMax: number;
}

/** Defaults for state-carrying streams: small headers, payloads up to one large KV page. */
export const DEFAULT_FRAME_LIMITS: Readonly<FrameLimits> = Object.freeze({
  headerBytesMax: 64 * 1024,
  payloadBytesMax: 16 * 1024 * 1024,
});

/** A frame header: a msgpack map; by convention `type` names the message. */
export type FrameHeader = Record<string, unknown>;

/** One decoded frame. */
export interface Frame {
  header: FrameHeader;
  /** May be a view into a buffer the decoder was given; the consumer now owns it. */
  payload: Uint8Array;
  /** True on the last frame of this stream direction. */
  final: boolean;
  /** False when the sender left the payload to its own checksum (see the flags above). */
  payloadChecked: boolean;
  /** Bytes this frame took on the wire (prefix + header + payload). */
  wireBytes: number;
  /** 0-based position of this frame in its stream direction. */
  index: number;
  /** How its body arrived, where a reader timed it (`FrameReader`); absent: not timed. */
  arrival?: FrameArrival;
}

/**
 * A frame body's arrival: the bytes that came after the read that brought its header, and the
 * time from that read to the one that completed the body (ms). A large frame's bytes leave the
 * sender back to back, so these are the rate the link delivered them at, as long as the reader
 * kept reading (bytes the receive window held while it did not come at once: a shorter span).
 */
export interface FrameArrival {
  bytes: number;
  ms: number;
}

/** How one frame is written. */
export interface FrameOptions {
  final?: boolean;
  limits?: FrameLimits;
  /**
   * False: the payload carries its own checksum, which its consumer verifies, so the frame's
   * CRC covers prefix and header only (default true: the CRC covers everything).
   */
  payloadChecked?: boolean;
}

/** An encoded frame as two separate writes, so a large payload is never copied. */
export interface EncodedFrame {
  /** Prefix and header. */
  head: Uint8Array;
  /** The caller's payload, unchanged. */
  payload: Uint8Array;
  wireBytes: number;
  final: boolean;
}

/** What went wrong while decoding, for code that must tell a cut stream from a corrupt one. */
export type FrameErrorKind =
  | "bad-magic"
  | "bad-version"
  | "bad-flags"
  | "empty-header"
  | "header-too-large"
  | "payload-too-large"
  | "bad-checksum"
  | "bad-header"
  | "data-after-final"
  | "ended-mid-frame"
  | "ended-before-final";

/** A framing violation. `kind` is machine-readable; the message is for people. */
export class FrameError extends ProtocolError {
  readonly kind: FrameErrorKind;
  constructor(kind: FrameErrorKind, message: string, hint?: string) {
    super(message, { hint });
    this.kind = kind;
  }
}

/**
 * Encodes one frame. The checksum covers the payload, so this reads the payload once but
 * never copies it.
 *
 * @example
 * ```ts
 * const { head, payload } = encodeFrame({ type: "StateChunk", seq: 3 }, bytes, { final: true });
 * await writer.write(head);
 * await writer.write(payload);
 * ```
 */
export function encodeFrame(
  header: FrameHeader,
  payload: Uint8Array = EMPTY,
  options: FrameOptions = {},
): EncodedFrame {
  const limits = options.limits ?? DEFAULT_FRAME_LIMITS;
  const packed = packMsgpack(header);
  if (packed.length > limits.headerBytesMax) {
    throw new LimitExceededError(
      `Cannot send frame: header of ${packed.length} bytes exceeds headerBytesMax (${limits.headerBytesMax})`,
      { hint: "keep bulk data in the payload, not the header" },
    );
  }
  if (payload.length > limits.payloadBytesMax) {
    throw new LimitExceededError(
      `Cannot send frame: payload of ${payload.length} bytes exceeds payloadBytesMax (${limits.payloadBytesMax})`,
      { hint: "split the payload into smaller frames or raise payloadBytesMax on both peers" },
    );
  }
  const head = new Uint8Array(FRAME_PREFIX_BYTES + packed.length);
  const view = new DataView(head.buffer);
  view.setUint16(0, FRAME_MAGIC);
  view.setUint8(2, FRAME_VERSION);
  const unchecked = options.payloadChecked === false && payload.length > 0;
  view.setUint8(3, (options.final ? FLAG_FINAL : 0) | (unchecked ? FLAG_PAYLOAD_UNCHECKED : 0));
  view.setUint32(4, packed.length);
  view.setUint32(8, payload.length);
  head.set(packed, FRAME_PREFIX_BYTES);
  let crc = crc32c(head.subarray(0, CHECKED_PREFIX_BYTES));
  crc = crc32c(head.subarray(FRAME_PREFIX_BYTES), crc);
  if (!unchecked) crc = crc32c(payload, crc);
  view.setUint32(12, crc);
  return { head, payload, wireBytes: head.length + payload.length, final: options.final ?? false };
}

/** The fields of a frame prefix, after validation. */
export interface FramePrefix {
  final: boolean;
  payloadChecked: boolean;
  headerBytes: number;
  payloadBytes: number;
  checksum: number;
}

/**
 * Validates the 16-byte prefix of frame `index` against `limits`; throws FrameError. Exposed
 * so that byte-level tools (the fault plan) can find frame boundaries the same way.
 */
export function parseFramePrefix(prefix: Uint8Array, limits: FrameLimits, index = 0): FramePrefix {
  const view = new DataView(prefix.buffer, prefix.byteOffset, FRAME_PREFIX_BYTES);
  const at = `Cannot decode frame ${index}`;
  const magic = view.getUint16(0);
  if (magic !== FRAME_MAGIC) {
    throw new FrameError(
      "bad-magic",
      `${at}: bad magic 0x${hex4(magic)} (expected 0x${hex4(FRAME_MAGIC)})`,
      "the peer is not speaking skippy-disagg framing: check the address and port",
    );
  }
  const version = view.getUint8(2);
  if (version !== FRAME_VERSION) {
    throw new FrameError(
      "bad-version",
      `${at}: unsupported frame version ${version} (this build speaks ${FRAME_VERSION})`,
      "run the same skippy-disagg version on both peers",
    );
  }
  const flags = view.getUint8(3);
  if ((flags & ~(FLAG_FINAL | FLAG_PAYLOAD_UNCHECKED)) !== 0) {
    throw new FrameError("bad-flags", `${at}: unknown flag bits 0x${flags.toString(16)}`);
  }
  const headerBytes = view.getUint32(4);
  const payloadBytes = view.getUint32(8);
  if (headerBytes === 0) throw new FrameError("empty-header", `${at}: empty header`);
  if (headerBytes > limits.headerBytesMax) {
    throw new FrameError(
      "header-too-large",
      `${at}: header of ${headerBytes} bytes exceeds headerBytesMax (${limits.headerBytesMax})`,
    );
  }
  if (payloadBytes > limits.payloadBytesMax) {
    throw new FrameError(
      "payload-too-large",
      `${at}: payload of ${payloadBytes} bytes exceeds payloadBytesMax (${limits.payloadBytesMax})`,
      "raise payloadBytesMax on this side, or make the peer send smaller frames",
    );
  }
  return {
    final: (flags & FLAG_FINAL) !== 0,
    payloadChecked: (flags & FLAG_PAYLOAD_UNCHECKED) === 0,
    headerBytes,
    payloadBytes,
    checksum: view.getUint32(12),
  };
}

function hex4(n: number): string {
  return n.toString(16).padStart(4, "0");
}

/**
 * Byte-fed frame decoder: a pure state machine with no I/O. Feed it whatever slices the
 * stream yields (one byte or many frames at a time); it returns the frames each slice
 * completes. Ceilings are checked on the prefix, before the body buffer is allocated.
 *
 * After an error the decoder is poisoned: frames completed earlier in the same slice are still
 * returned, and the error is thrown by the next `push()` or `finish()`.
 */
export class FrameDecoder {
  readonly #limits: FrameLimits;
  readonly #prefix = new Uint8Array(FRAME_PREFIX_BYTES);
  #prefixFill = 0;
  #current: FramePrefix | null = null;
  #body: Uint8Array | null = null;
  #bodyFill = 0;
  #index = 0;
  #sawFinal = false;
  #failure: FrameError | null = null;

  constructor(limits: FrameLimits = DEFAULT_FRAME_LIMITS) {
    this.#limits = limits;
  }

  /** Frames fully decoded so far. */
  get framesDecoded(): number {
    return this.#index;
  }

  /** Whether the final frame has been decoded. */
  get sawFinal(): boolean {
    return this.#sawFinal;
  }

  /** Feeds `chunk`; the decoder may keep views into it, so the caller must not reuse it. */
  push(chunk: Uint8Array): Frame[] {
    if (this.#failure) throw this.#failure;
    const frames: Frame[] = [];
    try {
      let at = 0;
      while (at < chunk.length) at = this.#step(chunk, at, frames);
    } catch (error) {
      if (!(error instanceof FrameError)) throw error;
      this.#failure = error;
      if (frames.length === 0) throw error;
    }
    return frames;
  }

  /**
   * Declares the end of the byte stream. Throws FrameError `ended-mid-frame` if a frame is
   * partly received, or `ended-before-final` if `requireFinal` and no final frame was seen.
   */
  finish(requireFinal = true): void {
    if (this.#failure) throw this.#failure;
    if (this.#prefixFill > 0 || this.#current) {
      const expected = FRAME_PREFIX_BYTES +
        (this.#current ? this.#current.headerBytes + this.#current.payloadBytes : 0);
      const got = this.#prefixFill + this.#bodyFill;
      throw new FrameError(
        "ended-mid-frame",
        `Stream ended mid-frame: got ${got} of ${
          this.#current ? expected : "at least " + expected
        } bytes of frame ${this.#index}`,
        "the peer stopped sending (crash, abort or network loss); the transfer is incomplete",
      );
    }
    if (requireFinal && !this.#sawFinal) {
      throw new FrameError(
        "ended-before-final",
        `Stream ended before the final frame (after ${this.#index} complete frames)`,
        "the peer stopped sending (crash, abort or network loss); the transfer is incomplete",
      );
    }
  }

  /**
   * The unfilled rest of the current frame's body buffer, while one is being assembled, so a
   * reader can read the stream straight into it (no slice, no copy); null otherwise. After
   * writing into it, report the bytes with `bodyFilled`.
   */
  get bodyRemaining(): Uint8Array | null {
    if (this.#failure || this.#body === null) return null;
    return this.#body.subarray(this.#bodyFill);
  }

  /**
   * Accounts for `filled`: bytes written at the start of `bodyRemaining`, returned as a view
   * that may lie in a new ArrayBuffer (a BYOB read transfers the buffer it was given). Returns
   * the frame when its body is complete.
   */
  bodyFilled(filled: Uint8Array): Frame[] {
    if (this.#failure) throw this.#failure;
    // The old view may be detached by now: the body's size comes from the prefix.
    const current = this.#current;
    const total = current ? current.headerBytes + current.payloadBytes : 0;
    assert(
      this.#body !== null && filled.byteOffset === this.#bodyFill &&
        filled.length <= total - this.#bodyFill && filled.buffer.byteLength === total,
      "bodyFilled() takes a view of the unfilled body",
    );
    this.#body = new Uint8Array(filled.buffer, 0, total);
    this.#bodyFill += filled.length;
    if (this.#bodyFill < total) return [];
    try {
      return [this.#complete(this.#body)];
    } catch (error) {
      if (error instanceof FrameError) this.#failure = error;
      throw error;
    }
  }

  /** Consumes bytes of `chunk` from `at`; returns the new offset. */
  #step(chunk: Uint8Array, at: number, frames: Frame[]): number {
    if (this.#sawFinal) {
      throw new FrameError(
        "data-after-final",
        `Cannot decode frame ${this.#index}: data after the final frame`,
      );
    }
    if (!this.#current) {
      const take = Math.min(FRAME_PREFIX_BYTES - this.#prefixFill, chunk.length - at);
      this.#prefix.set(chunk.subarray(at, at + take), this.#prefixFill);
      this.#prefixFill += take;
      at += take;
      if (this.#prefixFill < FRAME_PREFIX_BYTES) return at;
      this.#current = parseFramePrefix(this.#prefix, this.#limits, this.#index);
      const bodyBytes = this.#current.headerBytes + this.#current.payloadBytes;
      // Zero-copy path: the whole body is in this slice, so hand out a view of it.
      if (chunk.length - at >= bodyBytes) {
        frames.push(this.#complete(chunk.subarray(at, at + bodyBytes)));
        return at + bodyBytes;
      }
      this.#body = new Uint8Array(bodyBytes);
      this.#bodyFill = 0;
    }
    const body = this.#body!;
    const take = Math.min(body.length - this.#bodyFill, chunk.length - at);
    body.set(chunk.subarray(at, at + take), this.#bodyFill);
    this.#bodyFill += take;
    if (this.#bodyFill === body.length) frames.push(this.#complete(body));
    return at + take;
  }

  #complete(body: Uint8Array): Frame {
    const prefix = this.#current!;
    const index = this.#index;
    let crc = crc32c(this.#prefix.subarray(0, CHECKED_PREFIX_BYTES));
    crc = crc32c(prefix.payloadChecked ? body : body.subarray(0, prefix.headerBytes), crc);
    if (crc !== prefix.checksum) {
      // No checksum values in the message: they are derived from state content.
      throw new FrameError(
        "bad-checksum",
        `Cannot decode frame ${index}: checksum mismatch`,
        "the bytes were corrupted or spliced in transit; the transfer must be retried",
      );
    }
    const header = decodeHeader(body.subarray(0, prefix.headerBytes), index);
    this.#index++;
    this.#prefixFill = 0;
    this.#current = null;
    this.#body = null;
    this.#bodyFill = 0;
    this.#sawFinal = prefix.final;
    return {
      header,
      payload: body.subarray(prefix.headerBytes),
      final: prefix.final,
      payloadChecked: prefix.payloadChecked,
      wireBytes: FRAME_PREFIX_BYTES + body.length,
      index,
    };
  }
}

function decodeHeader(bytes: Uint8Array, index: number): FrameHeader {
  let value: unknown;
  try {
    value = unpackMsgpack(bytes);
  } catch {
    throw new FrameError("bad-header", `Cannot decode frame ${index}: header is not valid msgpack`);
  }
  // Only a plain map: msgpackr turns some bytes (0xc1, extensions) into other object kinds.
  const proto = typeof value === "object" && value !== null
    ? Object.getPrototypeOf(value)
    : undefined;
  if (proto !== Object.prototype && proto !== null) {
    throw new FrameError("bad-header", `Cannot decode frame ${index}: header is not a msgpack map`);
  }
  return value as FrameHeader;
}
