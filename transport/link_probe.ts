/**
 * Link measurement on a PeerConnection: RTT from LinkPing/LinkPong on the control stream, and
 * a short bounded bandwidth probe on a stream of its own (opened with LinkProbeOpen, answered
 * with LinkProbeDone). Both ends answer automatically inside `PeerConnection`; a peer that
 * does not advertise `linkProbeVersion` is never pinged (an older build would treat the
 * message as unknown).
 *
 * Bounds: one ping in flight per connection, at most one per `pingIntervalMsMin`, and a
 * responder that answers at most `pingAnswersPerSMax` (the rest are dropped, so a flood costs
 * the responder nothing but reads). A probe sends at most `probeBytesMax`, and the receiver
 * refuses a probe over its own `probeBytesMax` or while another one runs.
 *
 * @module
 */
import { PeerError } from "../core/errors.ts";
import type { FrameReader, FrameWriter } from "./framed_stream.ts";

/**
 * Version of the ping/probe exchange. Changelog: 1. First version. 2. The datagram loss probe
 * (loss_probe.ts); pings and the bandwidth probe unchanged.
 */
export const LINK_PROBE_VERSION = 2;

/** Frame types of the exchange (reserved on the control stream). */
export const LINK_PING = "LinkPing";
export const LINK_PONG = "LinkPong";
export const LINK_PROBE_OPEN = "LinkProbeOpen";
export const LINK_PROBE_DONE = "LinkProbeDone";

/** Bounds of the measurement, each with its unit last. */
export interface LinkProbeOptions {
  /** A ping unanswered for this long counts as lost. */
  pingTimeoutMs: number;
  /** Pings are spaced at least this far apart (a caller asking sooner waits). */
  pingIntervalMsMin: number;
  /** The responder answers at most this many pings per second. */
  pingAnswersPerSMax: number;
  /** Largest probe sent or accepted. */
  probeBytesMax: number;
  /** Payload bytes per probe frame. */
  probeChunkBytes: number;
  /** The whole probe (send and answer) must finish within this. */
  probeTimeoutMs: number;
}

export const DEFAULT_LINK_PROBE_OPTIONS: Readonly<LinkProbeOptions> = Object.freeze({
  pingTimeoutMs: 2_000,
  pingIntervalMsMin: 50,
  pingAnswersPerSMax: 100,
  probeBytesMax: 64 * 1024 * 1024,
  probeChunkBytes: 256 * 1024,
  probeTimeoutMs: 10_000,
});

/** What a probe measured. */
export interface ProbeResult {
  /** Bytes the receiver counted between its first and last probe frame. */
  bytes: number;
  /** The receiver's duration for those bytes (its own clock; a duration, not a reading). */
  receiveMs: number;
  /** `bytes / receiveMs`. */
  bandwidthBytesPerS: number;
  /** The sender's whole exchange, open to LinkProbeDone (includes one round trip). */
  elapsedMs: number;
}

/** The responder's bound on pings answered: a one-second token bucket. */
export class PingAnswerBudget {
  readonly #perS: number;
  #tokens: number;
  #lastMs: number;
  dropped = 0;

  constructor(perS: number, nowMs: number) {
    this.#perS = perS;
    this.#tokens = perS;
    this.#lastMs = nowMs;
  }

  /** Whether this ping may be answered now. */
  take(nowMs: number): boolean {
    this.#tokens = Math.min(
      this.#perS,
      this.#tokens + ((nowMs - this.#lastMs) / 1000) * this.#perS,
    );
    this.#lastMs = nowMs;
    if (this.#tokens >= 1) {
      this.#tokens -= 1;
      return true;
    }
    this.dropped++;
    return false;
  }
}

/** Sender side of a probe on a fresh stream's reader and writer. */
export async function sendProbe(
  reader: FrameReader,
  writer: FrameWriter,
  bytes: number,
  o: LinkProbeOptions,
): Promise<ProbeResult> {
  if (!(Number.isInteger(bytes) && bytes > o.probeChunkBytes && bytes <= o.probeBytesMax)) {
    throw new PeerError(
      `Invalid probe size ${bytes}: must be an integer over probeChunkBytes ${o.probeChunkBytes} and at most probeBytesMax ${o.probeBytesMax}`,
    );
  }
  const t0 = performance.now();
  const chunk = new Uint8Array(o.probeChunkBytes); // zeros: no content of any request
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) =>
    timer = setTimeout(
      () => reject(new PeerError(`Link probe took over probeTimeoutMs (${o.probeTimeoutMs} ms)`)),
      o.probeTimeoutMs,
    )
  );
  try {
    return await Promise.race([
      timeout,
      (async () => {
        // Read the answer while sending: a refusal arrives before the data is all out.
        const answering = reader.read().catch(() => null);
        try {
          await writer.write({ type: LINK_PROBE_OPEN, bytes, version: LINK_PROBE_VERSION });
          for (let sent = 0; sent < bytes; sent += chunk.length) {
            const n = Math.min(chunk.length, bytes - sent);
            const last = sent + n >= bytes;
            await writer.write({ type: "LinkProbeData" }, chunk.subarray(0, n), { final: last });
          }
        } catch (error) {
          const early = await answering;
          if (early?.header.type !== "StreamRefused") throw error;
        }
        const answer = await answering;
        const h = answer?.header;
        if (
          h?.type !== LINK_PROBE_DONE || typeof h.bytes !== "number" ||
          typeof h.receiveMs !== "number"
        ) {
          throw new PeerError(
            `Link probe refused by the peer: ${String(h?.reason ?? h?.type ?? "stream ended")}`,
          );
        }
        const receiveMs = Math.max(h.receiveMs, 1e-3);
        return {
          bytes: h.bytes,
          receiveMs,
          bandwidthBytesPerS: (h.bytes / receiveMs) * 1000,
          elapsedMs: performance.now() - t0,
        };
      })(),
    ]);
  } finally {
    clearTimeout(timer);
    reader.cancel();
    await writer.close();
  }
}

/**
 * The arrival rate of a byte stream in its steady state: the least-squares slope of bytes
 * against time over the frames after the first quarter of the expected bytes, in O(1) memory.
 * Bytes over the elapsed time overstates the link whenever data reaches the reader in bursts:
 * a backlog in the receive buffer when the clock starts (read at memory speed), or packets
 * held back behind a lost one and released at once when its retransmission arrives (a 100
 * Mbit/s emulated link whose bounded queue drops, probed at 14-17 MB/s over its 12.5 MB/s).
 * The first quarter absorbs the backlog; a stall and the burst after it sit on both sides of
 * the line and barely move its slope (a median over windows did not: with drops throughout,
 * most windows fell inside bursts, and a 100 Mbit/s link probed at up to 69 MB/s).
 *
 * @example
 * ```ts
 * const r = new ArrivalRate(800_000);
 * for (let k = 1; k <= 8; k++) r.add(8 * k, 100_000 * k); // 12.5 bytes/us throughout
 * r.receiveMs(800_000); // 64
 * ```
 */
export class ArrivalRate {
  #n = 0;
  #t = 0;
  #b = 0;
  #tt = 0;
  #tb = 0;

  constructor(readonly expectedBytes: number) {}

  /** Bytes counted so far and when (ms from the clock's start), in arrival order. */
  add(ms: number, bytes: number): void {
    if (bytes * 4 < this.expectedBytes) return;
    this.#n++;
    this.#t += ms;
    this.#b += bytes;
    this.#tt += ms * ms;
    this.#tb += ms * bytes;
  }

  /**
   * The time `bytes` take at the fitted rate, or null with under 4 frames after the first
   * quarter or a fit that is not a positive rate (the caller then uses the elapsed time).
   */
  receiveMs(bytes: number): number | null {
    const n = this.#n;
    if (n < 4) return null;
    const varT = this.#tt - (this.#t * this.#t) / n;
    if (!(varT > 1e-9)) return null;
    const slope = (this.#tb - (this.#t * this.#b) / n) / varT; // bytes per ms
    return slope > 0 && Number.isFinite(slope) ? bytes / slope : null;
  }
}

/**
 * Receiver side, after the opening frame: counts bytes from the frame that completes the first
 * half of the probe to the final one and answers with the count and the duration. The first
 * half is not counted: a fresh connection spends it ramping its congestion window up (slow
 * start takes about log2(bandwidth x RTT / initial window) round trips, 70 ms at 1 Gbit/s and
 * 10 ms), and a rate over the whole probe would understate the link (measured here: a 100
 * Mbit/s, 10 ms link probed at 3.5 MB/s from the first frame). The frame that starts the clock
 * is not counted either (its arrival starts it). The rate is the slope of the counted bytes' arrivals after
 * their first quarter (`ArrivalRate`), reported as the time the counted bytes take at it.
 */
export async function answerProbe(
  open: { bytes?: unknown },
  reader: FrameReader,
  writer: FrameWriter,
  o: LinkProbeOptions,
): Promise<void> {
  const refuse = (reason: string) => writer.refuse(reason);
  try {
    const want = open.bytes;
    if (typeof want !== "number" || !(want > 0 && want <= o.probeBytesMax)) {
      return await refuse(`probe size over probeBytesMax ${o.probeBytesMax}`);
    }
    let startMs: number | null = null;
    let counted = 0, total = 0;
    const rate = new ArrivalRate(want - Math.ceil(want / 2));
    for (;;) {
      const f = await reader.read();
      if (f === null) return await refuse("probe ended early");
      const now = performance.now();
      total += f.payload.length;
      if (total > want) return await refuse("probe longer than announced");
      if (startMs !== null) {
        counted += f.payload.length;
        rate.add(now - startMs, counted);
      } else if (total * 2 >= want || f.final) {
        startMs = now;
      }
      if (f.final) break;
    }
    const receiveMs = rate.receiveMs(counted) ?? performance.now() - startMs!;
    await writer.write({ type: LINK_PROBE_DONE, bytes: counted, receiveMs }, undefined, {
      final: true,
    });
  } catch {
    // A broken probe stream is the sender's problem; the connection carries on.
  } finally {
    reader.cancel();
    await writer.close();
  }
}

/**
 * The ping half of a connection: sequence numbers, the one ping in flight, spacing, and the
 * responder's budget. `PeerConnection` feeds it LinkPing/LinkPong frames and gives it a
 * function that writes a control frame.
 */
export class PingTracker {
  readonly #send: (header: { type: string; seq: number }) => Promise<unknown>;
  readonly #o: LinkProbeOptions;
  readonly #budget: PingAnswerBudget;
  #seq = 0;
  #waiter: { seq: number; sentMs: number; resolve: (rttMs: number | null) => void } | null = null;
  #inFlight: Promise<number | null> | null = null;
  #lastSentMs = -Infinity;
  #ended = false;

  constructor(
    send: (header: { type: string; seq: number }) => Promise<unknown>,
    o: LinkProbeOptions,
  ) {
    this.#send = send;
    this.#o = o;
    this.#budget = new PingAnswerBudget(o.pingAnswersPerSMax, performance.now());
  }

  /** Pings dropped by the responder's budget. */
  get answersDropped(): number {
    return this.#budget.dropped;
  }

  /** A LinkPing arrived: answer it if the budget allows. */
  onPing(header: Record<string, unknown>): void {
    if (typeof header.seq !== "number" || !this.#budget.take(performance.now())) return;
    this.#send({ type: LINK_PONG, seq: header.seq }).catch(() => {});
  }

  /** A LinkPong arrived: a late or unknown one is ignored. */
  onPong(header: Record<string, unknown>): void {
    const w = this.#waiter;
    if (!w || header.seq !== w.seq) return;
    this.#waiter = null;
    w.resolve(performance.now() - w.sentMs);
  }

  /** The connection ended: a pending ping resolves as lost. */
  end(): void {
    this.#ended = true;
    this.#waiter?.resolve(null);
    this.#waiter = null;
  }

  /** One round trip in ms, or null when lost (no answer within pingTimeoutMs). */
  ping(): Promise<number | null> {
    this.#inFlight ??= this.#pingOnce().finally(() => this.#inFlight = null);
    return this.#inFlight;
  }

  async #pingOnce(): Promise<number | null> {
    const wait = this.#lastSentMs + this.#o.pingIntervalMsMin - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    if (this.#ended) return null;
    const seq = ++this.#seq;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const answered = new Promise<number | null>((resolve) => {
      this.#waiter = { seq, sentMs: performance.now(), resolve };
      timer = setTimeout(() => {
        if (this.#waiter?.seq === seq) this.#waiter = null;
        resolve(null);
      }, this.#o.pingTimeoutMs);
    });
    this.#lastSentMs = performance.now();
    try {
      await this.#send({ type: LINK_PING, seq });
    } catch (error) {
      clearTimeout(timer);
      this.#waiter = null;
      throw error;
    }
    const rtt = await answered;
    clearTimeout(timer);
    return rtt;
  }
}
