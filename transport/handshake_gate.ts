/**
 * Admission of half-open handshakes (TLS done, node not yet authenticated), so that nobody who
 * can merely reach the port can lock trusted peers out.
 *
 * Bounds: at most `handshakesInFlightMax` half-open handshakes in all, and at most
 * `handshakesPerSourceMax` from one source address. A newcomer is always admitted; when a
 * bound is reached, the half-open handshake that has made the least progress is evicted to
 * make room: first the lowest stage (no complete frame yet, then ClientHello only), then the
 * one whose last progress is oldest. A stalled opener therefore loses its slot to anyone who
 * keeps moving, and a source that floods evicts mostly its own connections. The per-step
 * deadline (`handshakeStepMs`, enforced by establish.ts) bounds how long a stalled one can
 * hold a slot even without newcomers. Once authenticated, a handshake leaves the gate: the
 * authenticated path never waits behind stalled ones.
 *
 * Pure bookkeeping (no clock, no I/O): progress is ordered by a counter.
 */
import { assert } from "../core/errors.ts";

export const DEFAULT_HANDSHAKES_IN_FLIGHT_MAX = 64;
export const DEFAULT_HANDSHAKES_PER_SOURCE_MAX = 16;

/** Bounds of the gate. */
export interface HandshakeGateOptions {
  /** Half-open handshakes at once, all sources together. */
  handshakesInFlightMax?: number;
  /** Half-open handshakes at once from one source address. */
  handshakesPerSourceMax?: number;
}

/** One admitted half-open handshake. */
export interface HandshakeTicket {
  readonly source: string;
  /** A handshake step completed (a whole frame arrived). */
  progress(): void;
  /** The handshake finished, failed, or was evicted; idempotent. */
  release(): void;
  /** Whether the gate evicted this handshake to make room for another. */
  readonly evicted: boolean;
}

interface _Entry {
  source: string;
  stage: number;
  lastProgress: number;
  evict: () => void;
  live: boolean;
  evicted: boolean;
}

/** The source part of an address: "10.0.0.7:4433" -> "10.0.0.7", "[::1]:4433" -> "::1". */
export function sourceOfAddress(address: string): string {
  const v6 = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (v6) return v6[1];
  const colon = address.lastIndexOf(":");
  return colon > 0 && address.indexOf(":") === colon ? address.slice(0, colon) : address;
}

/** Counts and evicts half-open handshakes (see the file comment). */
export class HandshakeGate {
  readonly handshakesInFlightMax: number;
  readonly handshakesPerSourceMax: number;
  readonly #entries = new Set<_Entry>();
  readonly #perSource = new Map<string, number>();
  #clock = 0;
  #evictedTotal = 0;

  constructor(options: HandshakeGateOptions = {}) {
    this.handshakesInFlightMax = options.handshakesInFlightMax ?? DEFAULT_HANDSHAKES_IN_FLIGHT_MAX;
    this.handshakesPerSourceMax = options.handshakesPerSourceMax ??
      DEFAULT_HANDSHAKES_PER_SOURCE_MAX;
    assert(
      Number.isSafeInteger(this.handshakesInFlightMax) && this.handshakesInFlightMax >= 1,
      "handshakesInFlightMax must be a positive integer",
    );
    assert(
      Number.isSafeInteger(this.handshakesPerSourceMax) && this.handshakesPerSourceMax >= 1,
      "handshakesPerSourceMax must be a positive integer",
    );
  }

  /** Half-open handshakes now admitted. */
  get inFlight(): number {
    return this.#entries.size;
  }

  /** Half-open handshakes from `source` now admitted. */
  inFlightFrom(source: string): number {
    return this.#perSource.get(source) ?? 0;
  }

  /** Handshakes evicted so far to make room. */
  get evictedTotal(): number {
    return this.#evictedTotal;
  }

  /**
   * Admits a new handshake from `source`, evicting the least advanced one first where a bound
   * is reached (`evict` is called for it: it must close that connection).
   */
  admit(source: string, evict: () => void): HandshakeTicket {
    if (this.inFlightFrom(source) >= this.handshakesPerSourceMax) this.#evictOne(source);
    if (this.#entries.size >= this.handshakesInFlightMax) this.#evictOne(null);
    const entry: _Entry = {
      source,
      stage: 0,
      lastProgress: ++this.#clock,
      evict,
      live: true,
      evicted: false,
    };
    this.#entries.add(entry);
    this.#perSource.set(source, this.inFlightFrom(source) + 1);
    return {
      source,
      progress: () => {
        if (!entry.live) return;
        entry.stage++;
        entry.lastProgress = ++this.#clock;
      },
      release: () => this.#remove(entry),
      get evicted() {
        return entry.evicted;
      },
    };
  }

  #evictOne(source: string | null): void {
    let victim: _Entry | null = null;
    for (const e of this.#entries) {
      if (source !== null && e.source !== source) continue;
      if (
        victim === null || e.stage < victim.stage ||
        (e.stage === victim.stage && e.lastProgress < victim.lastProgress)
      ) victim = e;
    }
    if (victim === null) return;
    victim.evicted = true;
    this.#evictedTotal++;
    this.#remove(victim);
    try {
      victim.evict();
    } catch {
      // Closing an already closed connection: nothing left to free.
    }
  }

  #remove(entry: _Entry): void {
    if (!entry.live) return;
    entry.live = false;
    this.#entries.delete(entry);
    const n = this.inFlightFrom(entry.source) - 1;
    if (n > 0) this.#perSource.set(entry.source, n);
    else this.#perSource.delete(entry.source);
  }
}
