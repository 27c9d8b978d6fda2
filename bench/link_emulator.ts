/**
 * A user-space UDP relay on loopback that imposes a link between two endpoints: a rate
 * (serialization at `rateBitsPerS`), a one-way delay, random loss (seeded) and a bounded
 * queue (tail drop once `queueBytesMax` wait), each direction on its own. This kernel has no
 * `netem` (see ../shared/reference/deno-quic-facts.md), so QUIC between two workers goes
 * through this relay instead: the client sends to the relay's port, the relay forwards from
 * one upstream socket per client to the target and back.
 *
 * Faithfulness has limits and the relay states them: `measureRelayCeiling()` measures the
 * highest rate this process can relay, and the constructor refuses a rate above
 * `ceilingShare` of it; delays are delivered by timers, so their resolution is the event
 * loop's (about a millisecond), which the bench reports through RTTs measured across it.
 */
import { seededRandom } from "../transport/mod.ts";

/** One endpoint. */
export interface Endpoint {
  hostname: string;
  port: number;
}

/** What the link imposes, each with its unit last. */
export interface LinkShape {
  rateBitsPerS: number;
  oneWayDelayMs: number;
  /** Share of packets dropped at random, each direction. */
  lossFraction: number;
  /** Bytes waiting for the wire, each direction; a packet that does not fit is dropped. */
  queueBytesMax: number;
}

/** The share of a relay's measured ceiling it is trusted to sustain (`ceilingShare`'s default). */
export const DEFAULT_CEILING_SHARE = 0.8;

export interface LinkEmulatorOptions extends LinkShape {
  /** Where the relay listens (port 0: any free port). */
  listen?: Endpoint;
  target: Endpoint;
  /** Seed of the loss draws, so a run can be repeated. */
  seed?: number;
  /** The relay's measured ceiling (`measureRelayCeiling()`); a rate above the share is refused. */
  ceilingBitsPerS?: number;
  ceilingShare?: number;
  /** Distinct client addresses relayed at once. */
  clientsMax?: number;
}

/** Counters of one direction. */
export interface PipeStats {
  packets: number;
  bytes: number;
  lost: number;
  queueDrops: number;
}

/** One direction: serialization, delay, loss, bounded queue, FIFO delivery by one timer. */
class _Pipe<T> {
  readonly stats: PipeStats = { packets: 0, bytes: 0, lost: 0, queueDrops: 0 };
  readonly #shape: LinkShape;
  readonly #random: () => number;
  readonly #deliver: (packet: Uint8Array, to: T) => void;
  #busyUntilMs = 0;
  #queue: { atMs: number; packet: Uint8Array; to: T }[] = [];
  #head = 0;
  #timer: ReturnType<typeof setTimeout> | null = null;

  constructor(
    shape: LinkShape,
    random: () => number,
    deliver: (packet: Uint8Array, to: T) => void,
  ) {
    this.#shape = shape; // shared with the emulator: `reshape()` changes it in place
    this.#random = random;
    this.#deliver = deliver;
  }

  push(packet: Uint8Array, to: T): void {
    const now = performance.now();
    const bytesPerMs = this.#shape.rateBitsPerS / 8 / 1000;
    if (this.#shape.lossFraction > 0 && this.#random() < this.#shape.lossFraction) {
      this.stats.lost++;
      return;
    }
    const start = Math.max(now, this.#busyUntilMs);
    const waitingBytes = (start - now) * bytesPerMs;
    if (waitingBytes + packet.length > this.#shape.queueBytesMax) {
      this.stats.queueDrops++;
      return;
    }
    this.#busyUntilMs = start + packet.length / bytesPerMs;
    this.#queue.push({ atMs: this.#busyUntilMs + this.#shape.oneWayDelayMs, packet, to });
    this.stats.packets++;
    this.stats.bytes += packet.length;
    this.#arm();
  }

  close(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#queue = [];
  }

  #arm(): void {
    if (this.#timer !== null || this.#head >= this.#queue.length) return;
    const wait = Math.max(0, this.#queue[this.#head].atMs - performance.now());
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#flush();
    }, wait);
  }

  #flush(): void {
    const now = performance.now();
    while (this.#head < this.#queue.length && this.#queue[this.#head].atMs <= now) {
      const { packet, to } = this.#queue[this.#head++];
      this.#deliver(packet, to);
    }
    if (this.#head > 4096 && this.#head * 2 > this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#head = 0;
    }
    this.#arm();
  }
}

/**
 * The relay. Send to `endpoint`; traffic reaches `target` shaped, and replies come back
 * shaped the same way.
 *
 * @example
 * ```ts
 * const ceiling = await measureRelayCeiling();
 * using link = new LinkEmulator({ target, rateBitsPerS: 1e9, oneWayDelayMs: 1,
 *   lossFraction: 0, queueBytesMax: 1 << 20, ceilingBitsPerS: ceiling.bitsPerS });
 * connectQuic(link.endpoint);
 * ```
 */
export class LinkEmulator implements Disposable {
  readonly endpoint: Endpoint;
  readonly shape: LinkShape;
  readonly #forward: _Pipe<Deno.DatagramConn>;
  readonly #backward: _Pipe<Deno.NetAddr>;
  readonly #listener: Deno.DatagramConn;
  readonly #upstream = new Map<string, { conn: Deno.DatagramConn; client: Deno.NetAddr }>();
  readonly #target: Deno.NetAddr;
  readonly #clientsMax: number;
  readonly #ceiling: number | undefined;
  #closed = false;

  constructor(o: LinkEmulatorOptions) {
    checkLinkShape(o);
    const share = o.ceilingShare ?? DEFAULT_CEILING_SHARE;
    if (o.ceilingBitsPerS !== undefined && o.rateBitsPerS > o.ceilingBitsPerS * share) {
      throw new RangeError(
        `Link rate ${_mbit(o.rateBitsPerS)} is over what this relay sustains (${share} of its ` +
          `measured ceiling ${_mbit(o.ceilingBitsPerS)}): emulate a slower link or cover this ` +
          "rate with the cost model",
      );
    }
    this.shape = {
      rateBitsPerS: o.rateBitsPerS,
      oneWayDelayMs: o.oneWayDelayMs,
      lossFraction: o.lossFraction,
      queueBytesMax: o.queueBytesMax,
    };
    this.#clientsMax = o.clientsMax ?? 16;
    this.#ceiling = o.ceilingBitsPerS === undefined ? undefined : o.ceilingBitsPerS * share;
    this.#target = { transport: "udp", hostname: o.target.hostname, port: o.target.port };
    this.#listener = Deno.listenDatagram({
      transport: "udp",
      hostname: o.listen?.hostname ?? "127.0.0.1",
      port: o.listen?.port ?? 0,
    });
    const addr = this.#listener.addr as Deno.NetAddr;
    this.endpoint = { hostname: addr.hostname, port: addr.port };
    const seed = o.seed ?? 1;
    this.#forward = new _Pipe(
      this.shape,
      seededRandom(seed),
      (p, up) => this.#send(up, p, this.#target),
    );
    this.#backward = new _Pipe(
      this.shape,
      seededRandom(seed ^ 0x9e3779b9),
      (p, to) => this.#send(this.#listener, p, to),
    );
    this.#pumpClients();
  }

  /** Stops relaying and closes every socket. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#forward.close();
    this.#backward.close();
    try {
      this.#listener.close();
    } catch { /* already closed */ }
    for (const u of this.#upstream.values()) {
      try {
        u.conn.close();
      } catch { /* already closed */ }
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * Changes the link while traffic flows (a degradation mid-run): packets already queued keep
   * their delivery time, new ones get the new shape. The ceiling check applies again.
   */
  reshape(change: Partial<LinkShape>): void {
    const next = { ...this.shape, ...change };
    checkLinkShape(next);
    if (this.#ceiling !== undefined && next.rateBitsPerS > this.#ceiling) {
      throw new RangeError(
        `Link rate ${_mbit(next.rateBitsPerS)} is over what this relay sustains`,
      );
    }
    Object.assign(this.shape, next);
  }

  /** Counters: client to target, and back. */
  get stats(): { forward: PipeStats; backward: PipeStats } {
    return { forward: { ...this.#forward.stats }, backward: { ...this.#backward.stats } };
  }

  #send(conn: Deno.DatagramConn, packet: Uint8Array, to: Deno.NetAddr): void {
    if (this.#closed) return;
    conn.send(packet, to).catch(() => {});
  }

  async #pumpClients(): Promise<void> {
    while (!this.#closed) {
      let got: [Uint8Array, Deno.Addr];
      try {
        got = await this.#listener.receive();
      } catch {
        return;
      }
      const [packet, from] = got as [Uint8Array, Deno.NetAddr];
      const key = `${from.hostname}:${from.port}`;
      let up = this.#upstream.get(key);
      if (!up) {
        if (this.#upstream.size >= this.#clientsMax) continue;
        const conn = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
        up = { conn, client: from };
        this.#upstream.set(key, up);
        this.#pumpUpstream(conn, from);
      }
      this.#forward.push(packet, up.conn);
    }
  }

  async #pumpUpstream(conn: Deno.DatagramConn, client: Deno.NetAddr): Promise<void> {
    while (!this.#closed) {
      let got: [Uint8Array, Deno.Addr];
      try {
        got = await conn.receive();
      } catch {
        return;
      }
      this.#backward.push(got[0], client);
    }
  }
}

/** Throws a RangeError naming the first invalid field of a link shape. */
export function checkLinkShape(s: LinkShape): void {
  const bad = (name: string, v: number, what: string) =>
    new RangeError(`Invalid link ${name} ${v}: ${what}`);
  if (!(s.rateBitsPerS > 0 && Number.isFinite(s.rateBitsPerS))) {
    throw bad("rateBitsPerS", s.rateBitsPerS, "must be positive");
  }
  if (!(s.oneWayDelayMs >= 0)) throw bad("oneWayDelayMs", s.oneWayDelayMs, "must be 0 or more");
  if (!(s.lossFraction >= 0 && s.lossFraction <= 1)) {
    throw bad("lossFraction", s.lossFraction, "must be from 0 to 1");
  }
  if (!(s.queueBytesMax >= 1500)) {
    throw bad("queueBytesMax", s.queueBytesMax, "must hold at least one 1500-byte packet");
  }
}

function _mbit(bits: number): string {
  return `${(bits / 1e6).toFixed(0)} Mbit/s`;
}

/** What the relay can sustain in this process. */
export interface RelayCeiling {
  bitsPerS: number;
  packets: number;
  packetBytes: number;
  ms: number;
}

/**
 * Measures the relay's ceiling: `packets` datagrams of `packetBytes` through an unshaped relay
 * (a rate far above any emulated one, no delay) to a sink in this process, with at most
 * `windowPackets` in flight, so that what is measured is what the relay sustains rather than
 * how fast a blast overflows its socket buffer. Datagrams lost on the way are waited for at
 * most `stallMs`, then counted out. Sender, relay and sink share this process, so the figure
 * is conservative.
 */
export async function measureRelayCeiling(
  packets = 20_000,
  packetBytes = 1200,
  windowPackets = 32,
  stallMs = 200,
): Promise<RelayCeiling> {
  const sink = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
  const relay = new LinkEmulator({
    target: sink.addr as Deno.NetAddr,
    rateBitsPerS: 1e12,
    oneWayDelayMs: 0,
    lossFraction: 0,
    queueBytesMax: 1 << 30,
  });
  const sender = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
  const to: Deno.NetAddr = { transport: "udp", ...relay.endpoint };
  let received = 0, bytes = 0, sent = 0, lastMs = 0;
  let wake = null as (() => void) | null;
  const receiving = (async () => {
    for (;;) {
      let got: [Uint8Array, Deno.Addr];
      try {
        got = await sink.receive();
      } catch {
        return;
      }
      lastMs = performance.now();
      received++;
      bytes += got[0].length;
      wake?.();
    }
  })();
  const payload = new Uint8Array(packetBytes);
  const t0 = performance.now();
  while (sent < packets) {
    if (sent - received < windowPackets) {
      await sender.send(payload, to);
      sent++;
      continue;
    }
    // Window full: wait for an arrival, or count the window's stragglers out after stallMs.
    const arrived = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), stallMs);
      wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
    });
    wake = null;
    if (!arrived) received = sent; // lost: stop waiting for them (their bytes are not counted)
  }
  await new Promise((r) => setTimeout(r, stallMs));
  sink.close();
  await receiving;
  relay.close();
  sender.close();
  const ms = Math.max(lastMs - t0, 1e-3);
  return {
    bitsPerS: (bytes * 8 * 1000) / ms,
    packets: Math.round(bytes / packetBytes),
    packetBytes,
    ms,
  };
}
