/**
 * The native link relay (`native/link_relay.c`): the same link as `link_emulator.ts` (rate by
 * serialization, one-way delay, seeded loss, bounded queue, each direction on its own) in a C
 * process with `recvmmsg`/`sendmmsg` and a nanosecond timer, so it reaches the 1 Gbit/s
 * and 0.2 ms RTT points that the TypeScript relay (about 40 Mbit/s, 5 ms RTT floor here)
 * cannot. Built on first use with the system C compiler (`$CC`, else `cc`, `gcc` or `clang`)
 * into `<repo>/.cache/bench/`, keyed by a digest of its source, as the shim is at postinstall.
 *
 * `openLink()` picks it, or the TypeScript relay when no compiler is found, and says which.
 * Both state their ceiling (`measureCeiling`) and refuse a rate above `ceilingShare` of it.
 */
import {
  checkLinkShape,
  DEFAULT_CEILING_SHARE,
  LinkEmulator,
  type LinkEmulatorOptions,
  type LinkShape,
} from "./link_emulator.ts";

/** Counters of one direction, as the native relay reports them. */
export interface NativePipeStats {
  packets: number;
  bytes: number;
  lost: number;
  queueDrops: number;
  /** Dropped because the relay's slot ring was full (a bound of the relay, not of the link). */
  ringDrops: number;
  /** Datagrams over the relay's 2,048-byte slots, dropped. */
  oversize: number;
  delivered: number;
  /** How late deliveries were against their due time (scheduling, timer slack): never early. */
  lateUsMean: number;
  lateUsMax: number;
  lateOver100us: number;
}

export interface NativeCeiling {
  bitsPerS: number;
  packets: number;
  packetBytes: number;
  ms: number;
  window: number;
  /** Round trip through the relay both ways at delay 0 (one datagram at a time). */
  rttFloorUsMedian: number;
  rttFloorUsP90: number;
  /** Every trial's figure (`measureNativeCeiling` keeps the best), bits/s. */
  trialsBitsPerS?: number[];
}

/** What both relays offer the benches. */
export interface EmulatedLink extends Disposable {
  readonly kind: "native" | "typescript";
  readonly endpoint: { hostname: string; port: number };
  readonly shape: LinkShape;
  reshape(change: Partial<LinkShape>): Promise<void>;
  /** Drops of every kind, both directions (loss draws, queue, ring, oversize). */
  drops(): Promise<number>;
  close(): void;
}

const HERE = new URL(".", import.meta.url).pathname;
const SOURCE = `${HERE}native/link_relay.c`;

/** Builds (or finds) the relay binary; null when no C compiler works here. */
export async function buildNativeRelay(
  cacheDir = new URL("../.cache/bench", import.meta.url).pathname,
): Promise<string | null> {
  const src = await Deno.readFile(SOURCE);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", src));
  const key = Array.from(digest.subarray(0, 6), (b) => b.toString(16).padStart(2, "0")).join("");
  const out = `${cacheDir}/link_relay-${key}`;
  try {
    await Deno.stat(out);
    return out;
  } catch { /* not built yet */ }
  await Deno.mkdir(cacheDir, { recursive: true });
  const env = Deno.env.get("CC");
  for (const cc of env ? [env] : ["cc", "gcc", "clang"]) {
    try {
      const tmp = `${out}.tmp${Deno.pid}`;
      const r = await new Deno.Command(cc, {
        args: ["-O2", "-o", tmp, SOURCE, "-lpthread"],
        stdout: "null",
        stderr: "piped",
      }).output();
      if (!r.success) continue;
      await Deno.rename(tmp, out);
      return out;
    } catch { /* this compiler is missing: try the next */ }
  }
  return null;
}

/**
 * Runs the relay's own ceiling measurement (a windowed C sender and sink through it, all three
 * sharing this machine's cores) `trials` times and keeps the best: on a shared machine other
 * work takes turns, and the figure is what the relay sustained, not what it was left.
 */
export async function measureNativeCeiling(
  binary: string,
  packets = 100_000,
  trials = 3,
  /** All three on this one CPU (`taskset -c`): what a relay sharing it with both ends sustains. */
  cpu?: number,
): Promise<NativeCeiling> {
  let best: NativeCeiling | null = null;
  const trialsBitsPerS: number[] = [];
  const args = ["--ceiling", String(packets), "--nice", "-10"];
  for (let k = 0; k < trials; k++) {
    const r = await new Deno.Command(cpu === undefined ? binary : "taskset", {
      args: cpu === undefined ? args : ["-c", String(cpu), binary, ...args],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!r.success) {
      throw new Error(`link_relay ceiling run failed: ${new TextDecoder().decode(r.stderr)}`);
    }
    const c = JSON.parse(new TextDecoder().decode(r.stdout)) as NativeCeiling;
    trialsBitsPerS.push(c.bitsPerS);
    if (!best || c.bitsPerS > best.bitsPerS) best = c;
  }
  return { ...best!, trialsBitsPerS };
}

/** Line reader over the relay's stdout. */
class _Lines {
  #reader: ReadableStreamDefaultReader<string>;
  #buf = "";
  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  }
  async next(): Promise<string> {
    for (;;) {
      const nl = this.#buf.indexOf("\n");
      if (nl >= 0) {
        const line = this.#buf.slice(0, nl);
        this.#buf = this.#buf.slice(nl + 1);
        return line;
      }
      const { value, done } = await this.#reader.read();
      if (done) throw new Error("link_relay ended");
      this.#buf += value;
    }
  }
}

/** The native relay as a child process, driven over its stdin and stdout. */
export class NativeLinkRelay implements EmulatedLink {
  readonly kind = "native";
  readonly endpoint: { hostname: string; port: number };
  readonly shape: LinkShape;
  readonly #child: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #lines: _Lines;
  readonly #ceiling: number | undefined;
  #busy: Promise<unknown> = Promise.resolve();
  #closed = false;

  private constructor(
    child: Deno.ChildProcess,
    lines: _Lines,
    port: number,
    shape: LinkShape,
    ceiling: number | undefined,
  ) {
    this.#child = child;
    this.#stdin = child.stdin.getWriter();
    this.#lines = lines;
    this.endpoint = { hostname: "127.0.0.1", port };
    this.shape = shape;
    this.#ceiling = ceiling;
  }

  /** Starts the relay between a free loopback port and `o.target` (loopback only). */
  static async start(binary: string, o: LinkEmulatorOptions): Promise<NativeLinkRelay> {
    const share = o.ceilingShare ?? DEFAULT_CEILING_SHARE;
    const ceiling = o.ceilingBitsPerS === undefined ? undefined : o.ceilingBitsPerS * share;
    _checkRate(o.rateBitsPerS, ceiling);
    checkLinkShape(o);
    if (o.target.hostname !== "127.0.0.1" && o.target.hostname !== "localhost") {
      throw new RangeError(`Link target ${o.target.hostname} is not loopback: only 127.0.0.1`);
    }
    const child = new Deno.Command(binary, {
      args: [
        "--listen",
        String(o.listen?.port ?? 0),
        "--target",
        String(o.target.port),
        ..._shapeArgs(o),
        "--seed",
        String(o.seed ?? 1),
        "--clients-max",
        String(o.clientsMax ?? 16),
        // Scheduled ahead of ordinary work where allowed (root): the relay is the instrument.
        "--nice",
        "-10",
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const lines = new _Lines(child.stdout);
    const ready = await lines.next();
    const m = /^ready (\d+)$/.exec(ready);
    if (!m) throw new Error(`link_relay did not start: ${ready}`);
    const shape: LinkShape = {
      rateBitsPerS: o.rateBitsPerS,
      oneWayDelayMs: o.oneWayDelayMs,
      lossFraction: o.lossFraction,
      queueBytesMax: o.queueBytesMax,
    };
    return new NativeLinkRelay(child, lines, Number(m[1]), shape, ceiling);
  }

  /** The relay's process id (to pin it to a CPU: bench/cpu_pin.ts). */
  get pid(): number {
    return this.#child.pid;
  }

  /** Changes the link mid-run; queued packets keep their times. The ceiling applies again. */
  async reshape(change: Partial<LinkShape>): Promise<void> {
    const next = { ...this.shape, ...change };
    _checkRate(next.rateBitsPerS, this.#ceiling);
    checkLinkShape(next);
    const reply = await this.#ask(
      `shape ${next.rateBitsPerS} ${Math.round(next.oneWayDelayMs * 1000)} ${next.lossFraction} ${
        Math.round(next.queueBytesMax)
      }`,
    );
    if (reply !== "ok") throw new Error(`link_relay refused the shape: ${reply}`);
    Object.assign(this.shape, next);
  }

  /** Both directions' counters. */
  async stats(): Promise<{ forward: NativePipeStats; backward: NativePipeStats }> {
    const reply = await this.#ask("stats");
    if (!reply.startsWith("stats ")) throw new Error(`link_relay stats: ${reply}`);
    return JSON.parse(reply.slice(6));
  }

  async drops(): Promise<number> {
    const s = await this.stats();
    const d = (p: NativePipeStats) => p.lost + p.queueDrops + p.ringDrops + p.oversize;
    return d(s.forward) + d(s.backward);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stdin.close().catch(() => {});
    // End of stdin ends it; a kill covers a relay that is stuck.
    const timer = setTimeout(() => {
      try {
        this.#child.kill("SIGKILL");
      } catch { /* already gone */ }
    }, 2000);
    this.#child.status.finally(() => clearTimeout(timer));
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** Waits for the process to end (after `close()`). */
  async closed(): Promise<void> {
    await this.#child.status;
  }

  #ask(line: string): Promise<string> {
    const run = this.#busy.then(async () => {
      await this.#stdin.write(new TextEncoder().encode(line + "\n"));
      return await this.#lines.next();
    });
    this.#busy = run.catch(() => {});
    return run;
  }
}

function _shapeArgs(s: LinkShape): string[] {
  return [
    "--rate",
    String(s.rateBitsPerS),
    "--delay-us",
    String(Math.round(s.oneWayDelayMs * 1000)),
    "--loss",
    String(s.lossFraction),
    "--queue-bytes",
    String(Math.round(s.queueBytesMax)),
  ];
}

function _checkRate(rate: number, ceiling: number | undefined): void {
  if (ceiling !== undefined && rate > ceiling) {
    throw new RangeError(
      `Link rate ${(rate / 1e6).toFixed(0)} Mbit/s is over what this relay sustains (${
        (ceiling / 1e6).toFixed(0)
      } Mbit/s, a share of its measured ceiling): emulate a slower link or cover this rate ` +
        "with the cost model",
    );
  }
}

/** The TypeScript relay behind the same interface (the fallback without a C compiler). */
class _TsLink implements EmulatedLink {
  readonly kind = "typescript";
  readonly #link: LinkEmulator;
  constructor(o: LinkEmulatorOptions) {
    this.#link = new LinkEmulator(o);
  }
  get endpoint() {
    return this.#link.endpoint;
  }
  get shape() {
    return this.#link.shape;
  }
  reshape(change: Partial<LinkShape>): Promise<void> {
    this.#link.reshape(change);
    return Promise.resolve();
  }
  drops(): Promise<number> {
    const s = this.#link.stats;
    return Promise.resolve(
      s.forward.lost + s.forward.queueDrops + s.backward.lost + s.backward.queueDrops,
    );
  }
  close(): void {
    this.#link.close();
  }
  [Symbol.dispose](): void {
    this.close();
  }
}

/** Opens a link with the native relay when `binary` is given, else the TypeScript relay. */
export async function openLink(
  binary: string | null,
  o: LinkEmulatorOptions,
): Promise<EmulatedLink> {
  return binary ? await NativeLinkRelay.start(binary, o) : new _TsLink(o);
}

/** A link-grid point: rate, round trip and loss. */
export interface GridPoint {
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
}

/**
 * Opens the emulated link of one grid point in front of `target` (half the RTT each way) with
 * 50 ms of queue at the link rate, at least `queueBytesMin`.
 *
 * @example
 * ```ts
 * const link = await openGridLink(binary, decode, point, { ceilingBitsPerS, seed: 7 });
 * ```
 */
export function openGridLink(
  binary: string | null,
  target: { host: string; port: number },
  p: GridPoint,
  o: { ceilingBitsPerS: number; seed: number; queueBytesMin?: number },
): Promise<EmulatedLink> {
  return openLink(binary, {
    target: { hostname: target.host, port: target.port },
    rateBitsPerS: p.rateBitsPerS,
    oneWayDelayMs: p.rttMs / 2,
    lossFraction: p.lossFraction,
    queueBytesMax: Math.max(o.queueBytesMin ?? 64 * 1024, (p.rateBitsPerS / 8) * 0.05),
    ceilingBitsPerS: o.ceilingBitsPerS,
    seed: o.seed,
  });
}
