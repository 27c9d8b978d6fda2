/**
 * Frames over a byte channel: a writer that serializes whole frames and honours
 * backpressure, and a reader that turns a byte stream into frames and reports how it ended.
 */
import { assert } from "../core/errors.ts";
import {
  DEFAULT_FRAME_LIMITS,
  type EncodedFrame,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type FrameHeader,
  type FrameLimits,
} from "./frame.ts";

/** Maps a runtime error from the underlying stream (connection lost, reset) to a typed one. */
export type TransportErrorMapper = (error: unknown) => Error;

const passThrough: TransportErrorMapper = (error) =>
  error instanceof Error ? error : new Error(String(error));

/**
 * Writes frames to a WritableStream. Calls may overlap: frames go out whole, in call order,
 * each write waiting on `writer.ready` so memory stays bounded by the stream's high-water mark.
 */
export class FrameWriter {
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #limits: FrameLimits;
  readonly #mapError: TransportErrorMapper;
  #tail: Promise<unknown> = Promise.resolve();
  #finalQueued = false;
  #closed = false;

  constructor(
    writable: WritableStream<Uint8Array>,
    options: { limits?: FrameLimits; mapError?: TransportErrorMapper } = {},
  ) {
    this.#writer = writable.getWriter();
    this.#limits = options.limits ?? DEFAULT_FRAME_LIMITS;
    this.#mapError = options.mapError ?? passThrough;
  }

  /** Whether the final frame has been queued; nothing may follow it. */
  get finalQueued(): boolean {
    return this.#finalQueued;
  }

  /** Encodes a frame with this writer's limits (throws LimitExceededError), without sending. */
  encode(
    header: FrameHeader,
    payload?: Uint8Array,
    options: { final?: boolean; payloadChecked?: boolean } = {},
  ): EncodedFrame {
    return encodeFrame(header, payload, { ...options, limits: this.#limits });
  }

  /**
   * Sends one frame; resolves with its wire size once the stream has accepted it (accepted is
   * not delivered: only a reply from the peer proves delivery).
   */
  write(
    header: FrameHeader,
    payload?: Uint8Array,
    options: { final?: boolean } = {},
  ): Promise<number> {
    // Encode now, so size-limit errors reach the caller before anything is queued.
    return this.writeEncoded(this.encode(header, payload, options));
  }

  /** Sends a frame from `encode()`. */
  writeEncoded(frame: EncodedFrame): Promise<number> {
    assert(!this.#finalQueued, "frame written after the final frame");
    if (frame.final) this.#finalQueued = true;
    const run = async () => {
      try {
        await this.#writer.ready;
        await this.#writer.write(frame.head);
        // A zero-length write is pointless (and does not even open a QUIC stream): skip it.
        if (frame.payload.length > 0) {
          await this.#writer.ready;
          await this.#writer.write(frame.payload);
        }
      } catch (error) {
        throw this.#mapError(error);
      }
      return frame.wireBytes;
    };
    const result = this.#tail.then(run);
    this.#tail = result.catch(() => {});
    return result;
  }

  /** Waits for queued frames, then ends the byte stream. Errors are swallowed: best effort. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#tail;
    await this.#writer.close().catch(() => {});
  }

  /**
   * Answers a stream this end will not serve: one final `StreamRefused` frame naming why. A
   * peer already gone is not an error here (there is no one left to tell).
   */
  async refuse(reason: string): Promise<void> {
    await this.write({ type: "StreamRefused", reason }, undefined, { final: true }).catch(() => {});
  }

  /** Ends the byte stream without waiting for queued frames. */
  abort(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#writer.abort().catch(() => {});
  }
}

/** Bytes asked for by one read between frame bodies (prefixes, headers, small frames). */
const SCRATCH_BYTES = 64 * 1024;

/**
 * Reads frames from a ReadableStream. `read()` resolves null only after the final frame;
 * a stream that ends any other way throws FrameError `ended-mid-frame` or
 * `ended-before-final`, because a clean end of stream proves nothing on Deno QUIC.
 *
 * On a byte stream (Deno QUIC's are) it reads with a BYOB reader: a large frame's body is read
 * straight into the buffer the frame will be handed out in, so each payload byte is copied
 * once on this side (by the runtime), not into a chunk and then again into the body.
 */
export class FrameReader {
  readonly #reader: ReadableStreamDefaultReader<Uint8Array> | ReadableStreamBYOBReader;
  readonly #byob: boolean;
  readonly #decoder: FrameDecoder;
  readonly #mapError: TransportErrorMapper;
  readonly #pending: Frame[] = [];
  #done = false;
  /** When the read that left a frame's body to follow resolved, and its body bytes since. */
  #headAtMs = 0;
  #bodyBytes = 0;

  constructor(
    readable: ReadableStream<Uint8Array>,
    options: { limits?: FrameLimits; mapError?: TransportErrorMapper } = {},
  ) {
    let byob: ReadableStreamBYOBReader | null = null;
    try {
      byob = readable.getReader({ mode: "byob" });
    } catch {
      // Not a byte stream (the loopback fake, tests): chunks as the stream gives them.
    }
    this.#reader = byob ?? readable.getReader();
    this.#byob = byob !== null;
    this.#decoder = new FrameDecoder(options.limits ?? DEFAULT_FRAME_LIMITS);
    this.#mapError = options.mapError ?? passThrough;
  }

  /** The next frame; null after the final frame has been returned. */
  async read(): Promise<Frame | null> {
    while (this.#pending.length === 0) {
      if (this.#done || this.#decoder.sawFinal) {
        this.#finishReading();
        return null;
      }
      const body = this.#byob ? this.#decoder.bodyRemaining : null;
      let result: ReadableStreamReadResult<Uint8Array>;
      try {
        result = this.#byob
          ? await (this.#reader as ReadableStreamBYOBReader).read(
            body ?? new Uint8Array(SCRATCH_BYTES),
          )
          : await (this.#reader as ReadableStreamDefaultReader<Uint8Array>).read();
      } catch (error) {
        this.#done = true;
        throw this.#mapError(error);
      }
      if (result.done) {
        this.#done = true;
        this.#decoder.finish(true);
        continue;
      }
      const atMs = performance.now();
      if (body) {
        this.#bodyBytes += result.value.byteLength;
        const frames = this.#decoder.bodyFilled(result.value);
        for (const frame of frames) {
          frame.arrival = { bytes: this.#bodyBytes, ms: atMs - this.#headAtMs };
          this.#pending.push(frame);
        }
      } else {
        for (const frame of this.#decoder.push(result.value)) this.#pending.push(frame);
        this.#headAtMs = atMs;
        this.#bodyBytes = 0;
      }
    }
    return this.#pending.shift()!;
  }

  /** Stops reading; the peer's further bytes are discarded. */
  cancel(): void {
    this.#done = true;
    this.#reader.cancel().catch(() => {});
  }

  #finishReading(): void {
    // Surfaces "data after the final frame" if the final frame arrived with trailing bytes.
    this.#decoder.finish(true);
    // Nothing may follow the final frame; release the stream without waiting for the peer's
    // end of stream, which may never come if it keeps the stream open.
    if (!this.#done) this.cancel();
  }
}
