/**
 * Admission at the coordinator: at most `requestsInFlightMax` requests run at once; others
 * wait in a FIFO of at most `queueDepthMax` for at most `queueWaitMs`. A request that finds
 * the queue full, or waits too long, is refused with 503 and a Retry-After, so load beyond the
 * workers' capacity is answered, never failed inside a worker. A waiter whose client goes away
 * leaves the queue at once.
 */
import { ApiError } from "./errors.ts";

export interface AdmissionOptions {
  /** Requests running at once (default 2: `serve --sessions-max`'s default on one decoder). */
  requestsInFlightMax: number;
  /** Requests waiting for a slot; one more is refused with 503. */
  queueDepthMax: number;
  /** Longest wait for a slot, in ms, before a 503. */
  queueWaitMs: number;
  /** Retry-After sent with a 503, in seconds. */
  retryAfterS: number;
}

export const DEFAULT_ADMISSION: Readonly<AdmissionOptions> = {
  requestsInFlightMax: 2,
  queueDepthMax: 64,
  queueWaitMs: 30_000,
  retryAfterS: 1,
};

/** A slot held by one request: release it exactly once when the request ends. */
export interface Ticket {
  /** Time spent waiting in the queue, in ms. */
  queueMs: number;
  release(): void;
}

interface Waiter {
  grant: () => void;
}

export class Admission {
  readonly options: AdmissionOptions;
  #running = 0;
  #queue: Waiter[] = [];

  constructor(options: Partial<AdmissionOptions> = {}) {
    this.options = { ...DEFAULT_ADMISSION, ...options };
    for (const [name, v] of Object.entries(this.options)) {
      if (!Number.isInteger(v) || v < (name === "queueDepthMax" ? 0 : 1)) {
        throw new RangeError(`Admission option ${name} must be a positive integer, got ${v}`);
      }
    }
  }

  get running(): number {
    return this.#running;
  }

  get waiting(): number {
    return this.#queue.length;
  }

  /** Waits for a slot; throws a 503 ApiError when none comes, or when `signal` aborts. */
  async acquire(signal?: AbortSignal): Promise<Ticket> {
    const t0 = performance.now();
    // A client gone before it asked holds no slot and waits in no queue.
    if (signal?.aborted) throw new DOMException("The client went away", "AbortError");
    if (this.#running < this.options.requestsInFlightMax && this.#queue.length === 0) {
      this.#running++;
      return this.#ticket(0);
    }
    if (this.#queue.length >= this.options.queueDepthMax) {
      throw this.#busy(`the wait queue is full (queueDepthMax ${this.options.queueDepthMax})`);
    }
    const { promise, resolve, reject } = Promise.withResolvers<void>();
    const waiter: Waiter = { grant: resolve };
    this.#queue.push(waiter);
    const leave = (error: unknown) => {
      const i = this.#queue.indexOf(waiter);
      if (i >= 0) this.#queue.splice(i, 1);
      reject(error);
    };
    const timer = setTimeout(
      () => leave(this.#busy(`no slot within queueWaitMs ${this.options.queueWaitMs}`)),
      this.options.queueWaitMs,
    );
    const onAbort = () => leave(new DOMException("The client went away", "AbortError"));
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      await promise;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    return this.#ticket(performance.now() - t0);
  }

  #ticket(queueMs: number): Ticket {
    let released = false;
    return {
      queueMs,
      release: () => {
        if (released) return;
        released = true;
        const next = this.#queue.shift();
        // The slot passes straight to the next waiter; `running` stays the same.
        if (next) next.grant();
        else this.#running--;
      },
    };
  }

  #busy(why: string): ApiError {
    return new ApiError(
      503,
      "unavailable_error",
      `The server is at capacity: ${why}; retry after ${this.options.retryAfterS} s`,
      { code: "server_busy", retryAfterS: this.options.retryAfterS },
    );
  }
}
