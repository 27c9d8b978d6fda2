/**
 * What one prefill-side handoff retains for a retry, from export until CommitAck, failure or
 * lease expiry: every chunk header, the payloads of the end-of-prompt components, and the KV
 * pages not yet sent. A sent KV page is zeroed and dropped (a retry exports it again from the
 * context, whose cells of a finished chunk never change). Bounded twice: the exporter waits
 * while more than `exportQueueBytesMax` page bytes are unsent, and the end-of-prompt
 * components may not exceed `retainedBytesMax`.
 */
import { type ChunkHeader, LimitExceededError } from "../core/mod.ts";
import type { ExportedChunk } from "./exporter.ts";

interface Entry {
  chunk: ExportedChunk;
  /** Payload still held (end-of-prompt components, and KV pages not yet sent). */
  held: boolean;
  /** When it was exported (`performance.now()`): from then on it waits to be sent. */
  addedAtMs: number;
}

/** Thrown into the exporter once the handoff has ended: it stops prefilling. */
export class ExportStopped extends Error {}

export class RetainedState {
  readonly #entries: Entry[] = [];
  #unsentBytes = 0;
  #tailBytes = 0;
  #waiters: (() => void)[] = [];
  #stopped = false;
  #draining = false;

  constructor(readonly limits: { exportQueueBytesMax: number; retainedBytesMax: number }) {}

  /** Chunks exported so far. */
  get length(): number {
    return this.#entries.length;
  }

  /** Payload bytes held now (unsent KV pages plus end-of-prompt components). */
  get heldBytes(): number {
    return this.#unsentBytes + this.#tailBytes;
  }

  header(seq: number): ChunkHeader {
    return this.#entries[seq].chunk.header;
  }

  /** When chunk `seq` was exported, on this process's clock. */
  addedAt(seq: number): number {
    return this.#entries[seq].addedAtMs;
  }

  headers(): ChunkHeader[] {
    return this.#entries.map((e) => e.chunk.header);
  }

  /**
   * Logs an exported chunk, then waits while too many page bytes are unsent. Throws
   * ExportStopped once the handoff has ended, LimitExceededError past `retainedBytesMax`.
   */
  async add(chunk: ExportedChunk, onAdded: () => void): Promise<void> {
    if (this.#stopped) throw new ExportStopped();
    if (this.#draining) {
      chunk.payload.fill(0);
      return;
    }
    const bytes = chunk.header.payloadBytes;
    const page = chunk.header.kind === "kv-page";
    if (!page && this.#tailBytes + bytes > this.limits.retainedBytesMax) {
      chunk.payload.fill(0);
      throw new LimitExceededError(
        `End-of-prompt state of ${
          this.#tailBytes + bytes
        } bytes exceeds retainedBytesMax (${this.limits.retainedBytesMax})`,
        { hint: "raise retainedBytesMax, or serve this model colocated" },
      );
    }
    if (page) this.#unsentBytes += bytes;
    else this.#tailBytes += bytes;
    this.#entries.push({ chunk, held: true, addedAtMs: performance.now() });
    onAdded();
    while (this.#unsentBytes > this.limits.exportQueueBytesMax && !this.#stopped) {
      if (this.#draining) return;
      await new Promise<void>((resolve) => this.#waiters.push(resolve));
    }
    if (this.#stopped) throw new ExportStopped();
  }

  /** The payload of `seq` if still held; null when it must be exported again. */
  payload(seq: number): Uint8Array | null {
    const entry = this.#entries[seq];
    return entry.held ? entry.chunk.payload : null;
  }

  /** Chunk `seq` left: a KV page's payload is zeroed and dropped, which may unblock export. */
  markSent(seq: number): void {
    const entry = this.#entries[seq];
    if (entry.chunk.header.kind !== "kv-page" || !entry.held) return;
    entry.chunk.payload.fill(0);
    entry.held = false;
    this.#unsentBytes -= entry.chunk.header.payloadBytes;
    for (const wake of this.#waiters.splice(0)) wake();
  }

  /**
   * The handoff ended but the prefill worker completes the request itself: the exporter runs
   * to the end of the prompt (its context then holds the whole state), and every chunk it
   * still produces is zeroed and dropped at once, never retained or waited on.
   */
  drain(): void {
    this.#draining = true;
    this.erase();
    for (const wake of this.#waiters.splice(0)) wake();
  }

  /** The handoff ended: the exporter stops at its next chunk. */
  stop(): void {
    this.#stopped = true;
    for (const wake of this.#waiters.splice(0)) wake();
  }

  /** Zeroes and drops every held payload. */
  erase(): void {
    for (const entry of this.#entries) {
      if (entry.held) entry.chunk.payload.fill(0);
      entry.held = false;
    }
    this.#unsentBytes = 0;
    this.#tailBytes = 0;
  }
}
