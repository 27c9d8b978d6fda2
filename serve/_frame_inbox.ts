/**
 * The state frames a decode-side attempt has read from its handoff stream and not yet staged:
 * at most `framesMax` of them, so the next frame arrives while the previous one is imported,
 * and a fast sender is held back by transport credit, not by the decoder's memory. Payloads
 * are the frame decoder's own buffers (it never reuses them): no copy on the hot path.
 */
import type { FrameArrival } from "../transport/mod.ts";
import { faultPoint } from "./fault_points.ts";

export interface HeldFrame {
  payload: Uint8Array;
  tag: string;
  /** How the frame's body arrived, where the reader timed it. */
  arrival?: FrameArrival;
}

export class FrameInbox {
  readonly #frames = new Map<number, HeldFrame>();
  #held = 0;
  #waiter: (() => void) | null = null;

  constructor(readonly framesMax: number) {}

  /** Holds `frame` under `seq`; resolves once there is room to read the next one. */
  async put(seq: number, frame: HeldFrame): Promise<void> {
    faultPoint("decode-chunk-received");
    this.#frames.set(seq, frame);
    if (++this.#held >= this.framesMax) {
      await new Promise<void>((resolve) => this.#waiter = resolve);
    }
  }

  /** Takes the frame of `seq` out (undefined when none arrived). Call `done()` after staging. */
  take(seq: number): HeldFrame | undefined {
    const frame = this.#frames.get(seq);
    this.#frames.delete(seq);
    return frame;
  }

  /** One taken frame was staged (or refused): the reader may go on. */
  done(): void {
    this.#held = Math.max(0, this.#held - 1);
    this.release();
  }

  /** Wakes a waiting reader (the attempt is over, or there is room). */
  release(): void {
    const wake = this.#waiter;
    this.#waiter = null;
    wake?.();
  }

  /** Payload bytes held. */
  get bytes(): number {
    let n = 0;
    for (const f of this.#frames.values()) n += f.payload.byteLength;
    return n;
  }

  /** Zeroes and drops every held payload. */
  wipe(): void {
    for (const f of this.#frames.values()) f.payload.fill(0);
    this.#frames.clear();
  }
}
