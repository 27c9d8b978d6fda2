/**
 * A bounded async FIFO: the one queue shape transport/ uses between a background pump and its
 * consumer. `push` waits while the queue is full, which turns a slow consumer into backpressure
 * on the pump (and so on QUIC flow control) instead of an unbounded array.
 */
import { assert } from "./errors.ts";

interface Waiter<T> {
  resolve: (value: T) => void;
  reject: (error: unknown) => void;
}

export class BoundedQueue<T> {
  readonly #items: T[] = [];
  readonly #takers: Waiter<T | undefined>[] = [];
  readonly #pushers: Waiter<void>[] = [];
  #closed = false;
  #failure: unknown = undefined;

  constructor(readonly capacity: number) {
    assert(Number.isInteger(capacity) && capacity > 0, "queue capacity must be a positive integer");
  }

  get size(): number {
    return this.#items.length;
  }

  /**
   * Adds `item`, waiting while the queue is full. Resolves false (item not added) if the queue
   * was closed meanwhile; rejects if it failed.
   */
  async push(item: T): Promise<boolean> {
    while (!this.#closed && this.#items.length >= this.capacity) {
      if (this.#failure !== undefined) throw this.#failure;
      await new Promise<void>((resolve, reject) => this.#pushers.push({ resolve, reject }));
    }
    if (this.#failure !== undefined) throw this.#failure;
    if (this.#closed) return false;
    const taker = this.#takers.shift();
    if (taker) taker.resolve(item);
    else this.#items.push(item);
    return true;
  }

  /** Adds `item` if there is room; returns false (and drops nothing) when full or closed. */
  tryPush(item: T): boolean {
    if (this.#closed || this.#failure !== undefined || this.#items.length >= this.capacity) {
      return false;
    }
    const taker = this.#takers.shift();
    if (taker) taker.resolve(item);
    else this.#items.push(item);
    return true;
  }

  /** Takes the oldest item; resolves `undefined` once closed and drained; rejects if failed. */
  shift(): Promise<T | undefined> {
    if (this.#items.length > 0) {
      const item = this.#items.shift() as T;
      this.#pushers.shift()?.resolve();
      return Promise.resolve(item);
    }
    if (this.#failure !== undefined) return Promise.reject(this.#failure);
    if (this.#closed) return Promise.resolve(undefined);
    return new Promise((resolve, reject) => this.#takers.push({ resolve, reject }));
  }

  /** No more items will come; consumers drain what is queued, then get `undefined`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const taker of this.#takers.splice(0)) taker.resolve(undefined);
    for (const pusher of this.#pushers.splice(0)) pusher.resolve();
  }

  /** Ends the queue with `error`: queued items are dropped, every waiter rejects. */
  fail(error: unknown): void {
    if (this.#failure !== undefined) return;
    this.#failure = error;
    this.#items.length = 0;
    for (const taker of this.#takers.splice(0)) taker.reject(error);
    for (const pusher of this.#pushers.splice(0)) pusher.reject(error);
  }
}
