/**
 * The prefill worker's admission queue: up to `sessionsMax` prompts prefill at once (one
 * context each, from the pool), and up to `prefillQueueDepthMax` more wait here, first in
 * first out, each at most `prefillQueueWaitMs`. A request that finds the queue full, or that
 * waits longer, is answered `busy` at once (the coordinator then recomputes it colocated on
 * the decode worker, a named fallback), never an allocation failure and never a wait with no
 * end. Generic over the slot so the test can drive it with a fake pool.
 */

/** Bounds of the prefill queue, each named with its unit. */
export interface PrefillQueueOptions {
  /** Requests that may wait for a context at once; one more is answered `busy`. */
  prefillQueueDepthMax: number;
  /** Longest a request waits for a context, in ms; then it is answered `busy`. */
  prefillQueueWaitMs: number;
}

export const DEFAULT_PREFILL_QUEUE: Readonly<PrefillQueueOptions> = {
  prefillQueueDepthMax: 16,
  prefillQueueWaitMs: 60_000,
};

/**
 * While requests wait, the head retries this often besides each wake(): on a prefill+decode
 * worker the decode side frees contexts of the shared pool without telling the queue.
 */
export const QUEUE_RETRY_MS = 100;

/** Why a request was not admitted. */
export type NotAdmitted = "queue-full" | "wait-exceeded" | "cancelled";

export type Admission<T> =
  | { ok: true; slot: T; waitedMs: number }
  | { ok: false; why: NotAdmitted; message: string };

/** Since start, for stats: requests that waited, were answered busy, and how long they waited. */
export interface PrefillQueueTotals {
  prefillQueuedTotal: number;
  prefillBusyTotal: number;
  prefillQueueWaitMsTotal: number;
  prefillQueueWaitMsMax: number;
}

interface Waiter<T> {
  t0: number;
  settled: boolean;
  resolve(admission: Admission<T>): void;
  timer: ReturnType<typeof setTimeout>;
  signal: AbortSignal;
  onAbort: () => void;
}

export class PrefillQueue<T> {
  readonly #waiting: Waiter<T>[] = [];
  #pumping = false;
  #retry: ReturnType<typeof setInterval> | undefined;
  readonly #totals: PrefillQueueTotals = {
    prefillQueuedTotal: 0,
    prefillBusyTotal: 0,
    prefillQueueWaitMsTotal: 0,
    prefillQueueWaitMsMax: 0,
  };

  /**
   * `acquire` takes a free slot or returns null; `release` gives back one taken for a waiter
   * that went away meanwhile.
   */
  constructor(
    readonly options: PrefillQueueOptions,
    readonly acquire: () => Promise<T | null>,
    readonly release: (slot: T) => void,
  ) {}

  /** Requests waiting now. */
  get depth(): number {
    return this.#waiting.length;
  }

  get totals(): PrefillQueueTotals {
    return { ...this.#totals };
  }

  /**
   * A slot at once when one is free and nobody waits; else a place in the queue until one
   * frees (see wake()), the wait bound passes, or `signal` aborts.
   */
  async admit(signal: AbortSignal): Promise<Admission<T>> {
    if (signal.aborted) return this.#refused("cancelled");
    if (this.#waiting.length === 0 && !this.#pumping) {
      const slot = await this.acquire();
      if (slot !== null) {
        if (!signal.aborted) return { ok: true, slot, waitedMs: 0 };
        this.release(slot);
        return this.#refused("cancelled");
      }
    }
    if (this.#waiting.length >= this.options.prefillQueueDepthMax) {
      return this.#refused("queue-full");
    }
    this.#totals.prefillQueuedTotal++;
    return await new Promise<Admission<T>>((resolve) => {
      const waiter: Waiter<T> = {
        t0: performance.now(),
        settled: false,
        resolve,
        signal,
        onAbort: () => this.#settle(waiter, this.#refused("cancelled")),
        timer: setTimeout(
          () => this.#settle(waiter, this.#refused("wait-exceeded")),
          this.options.prefillQueueWaitMs,
        ),
      };
      signal.addEventListener("abort", waiter.onAbort, { once: true });
      this.#waiting.push(waiter);
      this.#retry ??= setInterval(() => this.wake(), QUEUE_RETRY_MS);
    });
  }

  /** A slot may have been freed: waiters take free slots, in arrival order. */
  wake(): void {
    if (this.#pumping) return;
    this.#pumping = true;
    this.#pump().finally(() => {
      this.#pumping = false;
      if (this.#waiting.length === 0) {
        clearInterval(this.#retry);
        this.#retry = undefined;
      }
    });
  }

  async #pump(): Promise<void> {
    while (this.#waiting.length > 0) {
      const slot = await this.acquire().catch(() => null);
      if (slot === null) return;
      const head = this.#waiting[0];
      if (!head) {
        this.release(slot);
        return;
      }
      const waitedMs = performance.now() - head.t0;
      this.#totals.prefillQueueWaitMsTotal += Math.round(waitedMs);
      this.#totals.prefillQueueWaitMsMax = Math.max(
        this.#totals.prefillQueueWaitMsMax,
        Math.round(waitedMs),
      );
      this.#settle(head, { ok: true, slot, waitedMs });
    }
  }

  #settle(waiter: Waiter<T>, admission: Admission<T>): void {
    if (waiter.settled) {
      if (admission.ok) this.release(admission.slot);
      return;
    }
    waiter.settled = true;
    clearTimeout(waiter.timer);
    waiter.signal.removeEventListener("abort", waiter.onAbort);
    const at = this.#waiting.indexOf(waiter);
    if (at >= 0) this.#waiting.splice(at, 1);
    waiter.resolve(admission);
  }

  #refused(why: NotAdmitted): Admission<T> {
    if (why !== "cancelled") this.#totals.prefillBusyTotal++;
    const { prefillQueueDepthMax: depth, prefillQueueWaitMs: waitMs } = this.options;
    const message = why === "queue-full"
      ? `the prefill worker is busy: every context is prefilling and its queue is full ` +
        `(prefillQueueDepthMax ${depth})`
      : why === "wait-exceeded"
      ? `the prefill worker is busy: no context freed within prefillQueueWaitMs (${waitMs} ms)`
      : "the request was cancelled while it waited for a prefill context";
    return { ok: false, why, message };
  }
}
