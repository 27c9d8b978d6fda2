/**
 * The loss probe: the share of packets a link loses, measured with datagrams (QUIC DATAGRAM
 * frames, never retransmitted). Neither pings nor the bandwidth probe can show it: both ride
 * streams, which retransmit what was lost, so a lost packet makes a ping late, not lost (ten
 * pings over a link losing 0.1% of its packets read 0%), while the handoff's congestion control
 * still collapses under that loss (a 10 ms link: 7-8 MB/s of its 125).
 *
 * The exchange, on a stream of its own: the sender opens with LinkLossOpen (a probe id and the
 * datagram count), the receiver answers LinkLossReady once it counts that probe's datagrams;
 * the sender sends the datagrams (each carries the probe id and its sequence number, the rest
 * zeros: nothing of any request), paced at a rate the caller picks under the link's (a queue
 * overflowing at the sender's own pace is congestion, not the link's loss), then LinkLossEnd
 * with how long datagrams may still be in flight; the receiver waits that long and answers
 * LinkLossDone with the count it received and the loss events: runs of consecutive missing
 * sequence numbers, each counted once. The loss fraction is loss events per datagram sent:
 * congestion control reacts once per loss event, whatever its length, and a receiver that
 * falls behind (a busy event loop, a full datagram buffer) loses one run, not a rate.
 *
 * Bounds: a probe sends or accepts at most `lossProbeDatagramsMax` datagrams, the receiver
 * runs one probe at a time and waits at most `lossProbeGraceMsMax` after the end, and the
 * whole exchange must finish within `lossProbeTimeoutMs`.
 *
 * @module
 */
import { PeerError } from "../core/errors.ts";
import type { DatagramPort } from "./channel.ts";
import type { FrameReader, FrameWriter } from "./framed_stream.ts";

/** Frame types of the exchange. */
export const LINK_LOSS_OPEN = "LinkLossOpen";
export const LINK_LOSS_READY = "LinkLossReady";
export const LINK_LOSS_END = "LinkLossEnd";
export const LINK_LOSS_DONE = "LinkLossDone";

/** First byte of a probe datagram (anything else on the connection's datagrams is ignored). */
const TAG = 0x4c;
/** Tag, probe id (u32), sequence number (u32). */
export const LOSS_DATAGRAM_HEADER_BYTES = 9;

/** Bounds of the loss probe, each with its unit last. */
export interface LossProbeOptions {
  /** Most datagrams one probe sends or accepts. */
  lossProbeDatagramsMax: number;
  /** Longest the receiver waits, after the sender's end, for datagrams still in flight. */
  lossProbeGraceMsMax: number;
  /** The whole exchange must finish within this. */
  lossProbeTimeoutMs: number;
}

export const DEFAULT_LOSS_PROBE_OPTIONS: Readonly<LossProbeOptions> = Object.freeze({
  lossProbeDatagramsMax: 20_000,
  lossProbeGraceMsMax: 2_000,
  lossProbeTimeoutMs: 15_000,
});

/** What a loss probe measured. */
export interface LossProbeResult {
  /** Datagrams sent. */
  sent: number;
  /** Datagrams the receiver counted. */
  received: number;
  /** Runs of consecutive datagrams missing (each counted once). */
  lossEvents: number;
  /** `lossEvents / sent`. */
  lossFraction: number;
  /** The sender's whole exchange, open to LinkLossDone. */
  elapsedMs: number;
}

/** How the sender paces a probe. */
export interface LossProbePlan {
  /** Datagrams to send (at most `lossProbeDatagramsMax`). */
  datagrams: number;
  /** The pace (bytes/s): well under the link's rate, so the sender's own queue never drops. */
  bytesPerS: number;
  /** How long after the last datagram the receiver still counts (bounded by the receiver). */
  graceMs: number;
}

/** One probe datagram of `bytes` (at least the header): tag, probe id, sequence number. */
export function lossDatagram(bytes: number, probeId: number, seq: number): Uint8Array {
  const d = new Uint8Array(Math.max(bytes, LOSS_DATAGRAM_HEADER_BYTES));
  const v = new DataView(d.buffer);
  v.setUint8(0, TAG);
  v.setUint32(1, probeId);
  v.setUint32(5, seq);
  return d;
}

/**
 * The receiver's count of the probe in progress, fed every datagram of the connection: only
 * those of the active probe, each sequence number once and below the announced count, count.
 */
export class LossProbeCounter {
  #probeId: number | null = null;
  #seen: Uint8Array = new Uint8Array(0);
  #received = 0;

  /** Whether a probe is being counted. */
  get active(): boolean {
    return this.#probeId !== null;
  }

  /** Starts counting `probeId`'s datagrams, sequence numbers 0 to `datagrams - 1`. */
  begin(probeId: number, datagrams: number): void {
    this.#probeId = probeId;
    this.#seen = new Uint8Array(datagrams);
    this.#received = 0;
  }

  /** One datagram received on the connection. */
  onDatagram(d: Uint8Array): void {
    if (this.#probeId === null || d.length < LOSS_DATAGRAM_HEADER_BYTES || d[0] !== TAG) return;
    const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
    if (v.getUint32(1) !== this.#probeId) return;
    const seq = v.getUint32(5);
    if (seq >= this.#seen.length || this.#seen[seq]) return;
    this.#seen[seq] = 1;
    this.#received++;
  }

  /** Stops counting; returns the count and the runs of missing sequence numbers. */
  end(): { received: number; lossEvents: number } {
    let lossEvents = 0;
    for (let k = 0; k < this.#seen.length; k++) {
      if (!this.#seen[k] && (k === 0 || this.#seen[k - 1])) lossEvents++;
    }
    this.#probeId = null;
    this.#seen = new Uint8Array(0);
    return { received: this.#received, lossEvents };
  }
}

/** Sender side, on a fresh stream's reader and writer and the connection's datagrams. */
export async function sendLossProbe(
  reader: FrameReader,
  writer: FrameWriter,
  port: DatagramPort,
  plan: LossProbePlan,
  o: LossProbeOptions,
): Promise<LossProbeResult> {
  checkLossProbePlan(plan, o);
  const t0 = performance.now();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) =>
    timer = setTimeout(
      () =>
        reject(
          new PeerError(`Loss probe took over lossProbeTimeoutMs (${o.lossProbeTimeoutMs} ms)`),
        ),
      o.lossProbeTimeoutMs,
    )
  );
  try {
    return await Promise.race([timeout, exchangeLossProbe(reader, writer, port, plan, t0)]);
  } finally {
    clearTimeout(timer);
    reader.cancel();
    await writer.close();
  }
}

/** Refuses a plan out of bounds before anything is sent. */
function checkLossProbePlan(plan: LossProbePlan, o: LossProbeOptions): void {
  const n = plan.datagrams;
  if (!(Number.isInteger(n) && n > 0 && n <= o.lossProbeDatagramsMax)) {
    throw new PeerError(
      `Invalid loss probe of ${n} datagrams: must be a positive integer, at most lossProbeDatagramsMax ${o.lossProbeDatagramsMax}`,
    );
  }
  if (!(plan.bytesPerS > 0) || !(plan.graceMs >= 0)) {
    throw new PeerError(
      `Invalid loss probe pace ${plan.bytesPerS} B/s or grace ${plan.graceMs} ms: the pace must be positive, the grace at least 0`,
    );
  }
}

/**
 * The sender's exchange: LinkLossOpen, wait for LinkLossReady, the datagrams at the plan's
 * pace, LinkLossEnd, then the receiver's LinkLossDone turned into a result (`t0`: when the
 * probe started).
 */
async function exchangeLossProbe(
  reader: FrameReader,
  writer: FrameWriter,
  port: DatagramPort,
  plan: LossProbePlan,
  t0: number,
): Promise<LossProbeResult> {
  const n = plan.datagrams;
  const probeId = crypto.getRandomValues(new Uint32Array(1))[0];
  await writer.write({ type: LINK_LOSS_OPEN, probeId, datagrams: n });
  const ready = (await reader.read())?.header;
  if (ready?.type !== LINK_LOSS_READY) {
    throw new PeerError(
      `Loss probe refused by the peer: ${String(ready?.reason ?? ready?.type ?? "stream ended")}`,
    );
  }
  await sendPaced(port, probeId, n, plan.bytesPerS);
  await writer.write({ type: LINK_LOSS_END, graceMs: plan.graceMs });
  const done = (await reader.read())?.header;
  if (
    done?.type !== LINK_LOSS_DONE || typeof done.received !== "number" ||
    typeof done.lossEvents !== "number"
  ) {
    throw new PeerError(
      `Loss probe answer missing: ${String(done?.reason ?? done?.type ?? "stream ended")}`,
    );
  }
  const received = Math.min(n, Math.max(0, done.received));
  // At most one event per missing datagram, at least one if any is missing.
  const missing = n - received;
  const lossEvents = Math.min(missing, Math.max(missing > 0 ? 1 : 0, done.lossEvents));
  return {
    sent: n,
    received,
    lossEvents,
    lossFraction: lossEvents / n,
    elapsedMs: performance.now() - t0,
  };
}

/** Sends probe `probeId`'s `n` datagrams, each as large as the port allows, at `bytesPerS`. */
async function sendPaced(
  port: DatagramPort,
  probeId: number,
  n: number,
  bytesPerS: number,
): Promise<void> {
  const bytes = port.maxBytes;
  // One buffer for every datagram: each send is awaited (the runtime has copied it), and only
  // the sequence number changes.
  const datagram = lossDatagram(bytes, probeId, 0);
  const seqView = new DataView(datagram.buffer, 5, 4);
  const start = performance.now();
  for (let seq = 0; seq < n;) {
    // Every datagram due by now at the pace, then a millisecond's pause.
    const due = Math.min(
      n,
      Math.floor(((performance.now() - start) * bytesPerS) / 1000 / bytes) + 1,
    );
    for (; seq < due; seq++) {
      seqView.setUint32(0, seq);
      await port.send(datagram);
    }
    if (seq < n) await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/**
 * Receiver side, after the opening frame: counts the probe's datagrams on `counter` (which the
 * connection feeds) until the sender's end and its grace period, then answers with the count.
 * Refuses a probe over `lossProbeDatagramsMax`, while another runs (the counter holds one), or
 * when the connection has no datagrams.
 */
export async function answerLossProbe(
  open: { probeId?: unknown; datagrams?: unknown },
  reader: FrameReader,
  writer: FrameWriter,
  counter: LossProbeCounter | null,
  o: LossProbeOptions,
): Promise<void> {
  const refuse = (reason: string) => writer.refuse(reason);
  try {
    const { probeId, datagrams } = open;
    if (counter === null) return await refuse("no datagrams on this connection");
    if (counter.active) return await refuse("a loss probe is already running");
    if (
      typeof probeId !== "number" || !Number.isInteger(probeId) || probeId < 0 ||
      probeId > 0xffffffff
    ) {
      return await refuse("probe id is not a 32-bit unsigned integer");
    }
    if (
      typeof datagrams !== "number" || !Number.isInteger(datagrams) || datagrams <= 0 ||
      datagrams > o.lossProbeDatagramsMax
    ) {
      return await refuse(`probe over lossProbeDatagramsMax ${o.lossProbeDatagramsMax}`);
    }
    counter.begin(probeId, datagrams);
    let grace = NaN;
    try {
      await writer.write({ type: LINK_LOSS_READY });
      const end = await reader.read();
      if (end?.header.type === LINK_LOSS_END) grace = Number(end.header.graceMs);
      if (grace >= 0) {
        await new Promise((r) => setTimeout(r, Math.min(grace, o.lossProbeGraceMsMax)));
      }
    } finally {
      const { received, lossEvents } = counter.end();
      if (grace >= 0) {
        await writer.write({ type: LINK_LOSS_DONE, received, lossEvents }, undefined, {
          final: true,
        });
      } else {
        await refuse("loss probe ended without its LinkLossEnd");
      }
    }
  } catch {
    // A broken probe stream is the sender's problem; the connection carries on.
  } finally {
    reader.cancel();
    await writer.close();
  }
}
