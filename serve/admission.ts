/**
 * Admission on the decode worker: a request takes its session (a sequence of the shared
 * context, with all its KV cells and its recurrent slot, or a context of its own) before it
 * starts; when none is free it waits in a bounded FIFO queue (`queueDepthMax` requests, each
 * at most `queueWaitMs`), or is refused with a busy outcome the coordinator can turn into a
 * 503 or a fallback. Nothing is allocated inside llama.cpp after admission, so an admitted
 * request never meets an allocation failure there.
 */
import { UsageError } from "../core/errors.ts";
import type { PooledSession, SessionPool } from "./pool.ts";

export interface AdmissionOptions {
  /** Requests that may wait for a session at once (requests); beyond that: refused busy. */
  queueDepthMax: number;
  /** How long a request waits for a session before it is refused busy (milliseconds). */
  queueWaitMs: number;
}

export const ADMISSION_DEFAULTS: Readonly<AdmissionOptions> = {
  queueDepthMax: 64,
  queueWaitMs: 1_000,
};

export type Admitted =
  | { ok: true; session: PooledSession; waitedMs: number }
  | { ok: false; busy: string; waitedMs: number };

interface Waiter {
  resolve: (session: PooledSession | null) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** What admission did since start, and who waits now (counts only). */
export interface AdmissionCounters {
  admissionWaiting: number;
  admittedTotal: number;
  queuedTotal: number;
  refusedBusyTotal: number;
}

export class Admission {
  readonly #waiters: Waiter[] = [];
  readonly #totals = { admittedTotal: 0, queuedTotal: 0, refusedBusyTotal: 0 };
  #closed = false;

  constructor(readonly pool: SessionPool, readonly options: Readonly<AdmissionOptions>) {
    validateAdmission(options);
    pool.whenFree = () => this.#wake();
  }

  /**
   * A session now, after a bounded wait (`waitMs`, default `queueWaitMs`), or a busy refusal
   * that says why.
   */
  async acquire(waitMs = this.options.queueWaitMs): Promise<Admitted> {
    const t0 = performance.now();
    // Arrivals never overtake waiters.
    let session = this.#waiters.length === 0 ? await this.pool.tryAcquire() : null;
    if (this.#closed) {
      if (session) this.pool.release(session);
      return this.#refuse("the worker is closing", t0);
    }
    if (!session) {
      if (this.#waiters.length >= this.options.queueDepthMax) {
        return this.#refuse(
          `all ${this.pool.capacity} sessions in use and ${this.options.queueDepthMax} requests waiting`,
          t0,
        );
      }
      this.#totals.queuedTotal++;
      session = await new Promise<PooledSession | null>((resolve) => {
        const waiter: Waiter = {
          resolve,
          timer: setTimeout(() => {
            this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
            resolve(null);
          }, waitMs),
        };
        this.#waiters.push(waiter);
      });
      if (!session) {
        return this.#refuse(
          `all ${this.pool.capacity} sessions stayed in use for ${waitMs} ms`,
          t0,
        );
      }
    }
    this.#totals.admittedTotal++;
    return { ok: true, session, waitedMs: performance.now() - t0 };
  }

  /**
   * A session now (never waits), or a busy refusal; waiters are not overtaken. `willWait`: the
   * caller queues next (`acquire`), so this refusal is not counted as one.
   */
  async acquireNow(willWait = false): Promise<Admitted> {
    const t0 = performance.now();
    const session = this.#waiters.length === 0 ? await this.pool.tryAcquire() : null;
    if (!session) {
      const waiting = this.#waiters.length;
      const why = `all ${this.pool.capacity} sessions in use${
        waiting > 0 ? ` (${waiting} waiting)` : ""
      }`;
      if (willWait) return { ok: false, busy: why, waitedMs: 0 };
      return this.#refuse(why, t0);
    }
    this.#totals.admittedTotal++;
    return { ok: true, session, waitedMs: performance.now() - t0 };
  }

  /** Gives the session back; the next waiter gets it once it is wiped. */
  release(session: PooledSession): void {
    this.pool.release(session);
  }

  get counters(): AdmissionCounters {
    return { admissionWaiting: this.#waiters.length, ...this.#totals };
  }

  /** Refuses every waiter (the worker is closing). */
  close(): void {
    this.#closed = true;
    for (const w of this.#waiters.splice(0)) {
      clearTimeout(w.timer);
      w.resolve(null);
    }
  }

  #refuse(why: string, t0: number): Admitted {
    this.#totals.refusedBusyTotal++;
    return {
      ok: false,
      busy: `The decode worker is busy: ${why}`,
      waitedMs: performance.now() - t0,
    };
  }

  async #wake(): Promise<void> {
    while (this.#waiters.length > 0) {
      const session = await this.pool.tryAcquire();
      if (!session) return;
      const waiter = this.#waiters.shift();
      if (!waiter) return this.pool.release(session);
      clearTimeout(waiter.timer);
      waiter.resolve(session);
    }
  }
}

/** Throws UsageError naming the first out-of-range admission option. */
export function validateAdmission(o: AdmissionOptions): void {
  if (!Number.isInteger(o.queueDepthMax) || o.queueDepthMax < 0 || o.queueDepthMax > 65_536) {
    throw new UsageError(`queueDepthMax ${o.queueDepthMax} is out of range: use 0 to 65536`);
  }
  if (!Number.isInteger(o.queueWaitMs) || o.queueWaitMs < 0 || o.queueWaitMs > 3_600_000) {
    throw new UsageError(`queueWaitMs ${o.queueWaitMs} is out of range: use 0 to 3600000 ms`);
  }
}
