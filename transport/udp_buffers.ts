/**
 * The host's UDP receive buffer, which QUIC rides on. Deno sets no socket buffer size on its QUIC
 * endpoints, so each socket gets the system default; when a receiver falls behind by more than that
 * (a burst of bandwidth x RTT arriving while its event loop is busy), the kernel drops datagrams and
 * the sender's congestion control backs off. Measured on emulated links (lab-state, 512 tokens,
 * 1 Gbit/s, 208 KiB default): 7,524 drops over six handoffs, and at 2 ms the link part of the tail
 * 115-189 ms; with a 4 MiB default no drop and 35-38 ms (docs/bench-report/link-matrix/FINDINGS.md,
 * section 000).
 *
 * This module reads the defaults (Linux: /proc/sys/net/core; macOS: `sysctl`) and the host-wide
 * drop counter (Linux: /proc/net/snmp `RcvbufErrors`), and says what to raise when the default is
 * under `udpReceiveBufferBytesMin`. It changes nothing on the host.
 *
 * @module
 */

/** What the host gives a UDP socket that asks for nothing. */
export interface UdpBufferFacts {
  /** The receive buffer a new socket gets, bytes. */
  receiveDefaultBytes: number;
  /** The largest receive buffer a socket may ask for, bytes. */
  receiveMaxBytes: number;
  /** The setting names for this OS (default, max). */
  settings: { default: string; max: string };
}

/**
 * The receive buffer below which a worker warns: 4 MiB holds about 33 ms of 1 Gbit/s, or 3 ms of
 * 10 Gbit/s, of a receiver that falls behind.
 */
export const UDP_RECEIVE_BUFFER_BYTES_MIN = 4 * 2 ** 20;

/** The host's UDP receive buffer facts; null where the OS is not Linux or macOS, or unreadable. */
export async function readUdpBufferFacts(): Promise<UdpBufferFacts | null> {
  try {
    if (Deno.build.os === "linux") {
      const read = async (name: string) =>
        Number((await Deno.readTextFile(`/proc/sys/net/core/${name}`)).trim());
      return _facts(await read("rmem_default"), await read("rmem_max"), {
        default: "net.core.rmem_default",
        max: "net.core.rmem_max",
      });
    }
    if (Deno.build.os === "darwin") {
      const out = await new Deno.Command("sysctl", {
        args: ["-n", "net.inet.udp.recvspace", "kern.ipc.maxsockbuf"],
        stdout: "piped",
        stderr: "null",
      }).output();
      const [def, max] = new TextDecoder().decode(out.stdout).trim().split(/\s+/).map(Number);
      return _facts(def, max, { default: "net.inet.udp.recvspace", max: "kern.ipc.maxsockbuf" });
    }
  } catch { /* unreadable: no facts, no advice */ }
  return null;
}

function _facts(
  receiveDefaultBytes: number,
  receiveMaxBytes: number,
  settings: UdpBufferFacts["settings"],
): UdpBufferFacts | null {
  const ok = (n: number) => Number.isFinite(n) && n > 0;
  return ok(receiveDefaultBytes) && ok(receiveMaxBytes)
    ? { receiveDefaultBytes, receiveMaxBytes, settings }
    : null;
}

/**
 * The host-wide count of UDP datagrams dropped for a full receive buffer (Linux `RcvbufErrors`),
 * or null where it cannot be read. Host-wide: a difference across a transfer counts every UDP
 * socket's drops in that time.
 */
export async function readUdpReceiveDrops(): Promise<number | null> {
  if (Deno.build.os !== "linux") return null;
  try {
    return udpReceiveDropsFrom(await Deno.readTextFile("/proc/net/snmp"));
  } catch {
    return null;
  }
}

/** `readUdpReceiveDrops()` without waiting (a counter read on every stats request). */
export function readUdpReceiveDropsSync(): number | null {
  if (Deno.build.os !== "linux") return null;
  try {
    return udpReceiveDropsFrom(Deno.readTextFileSync("/proc/net/snmp"));
  } catch {
    return null;
  }
}

/** The host's default receive buffer and its kernel's receive-buffer drops over some work. */
export interface UdpDropCount {
  receiveDefaultBytes: number | null;
  /** Host-wide drops between the count's start and its end (null: unreadable). */
  receiveDrops: number | null;
}

/**
 * Starts counting the host's UDP receive-buffer drops; the function it returns ends the count.
 *
 * @example
 * ```ts
 * const end = await countUdpReceiveDrops();
 * await runHandoff(client, request);
 * row.udp = await end(); // { receiveDefaultBytes: 212992, receiveDrops: 7524 }
 * ```
 */
export async function countUdpReceiveDrops(): Promise<() => Promise<UdpDropCount>> {
  const before = await readUdpReceiveDrops();
  return async () => {
    const after = await readUdpReceiveDrops();
    return {
      receiveDefaultBytes: (await readUdpBufferFacts())?.receiveDefaultBytes ?? null,
      receiveDrops: before !== null && after !== null ? after - before : null,
    };
  };
}

/** `RcvbufErrors` from the text of /proc/net/snmp (its `Udp:` header and value lines). */
export function udpReceiveDropsFrom(snmp: string): number | null {
  const lines = snmp.split("\n").filter((l) => l.startsWith("Udp:"));
  if (lines.length < 2) return null;
  const names = lines[0].split(/\s+/), values = lines[1].split(/\s+/);
  const k = names.indexOf("RcvbufErrors");
  const v = k > 0 ? Number(values[k]) : NaN;
  return Number.isFinite(v) ? v : null;
}

/**
 * What to tell the operator when the default receive buffer is under `minBytes` (null: nothing
 * to say). Names the current value, why it matters, and the commands that raise it.
 *
 * @example
 * ```ts
 * const facts = await readUdpBufferFacts();
 * const advice = facts && udpBufferAdvice(facts);
 * if (advice) console.error(advice);
 * ```
 */
export function udpBufferAdvice(
  f: UdpBufferFacts,
  minBytes = UDP_RECEIVE_BUFFER_BYTES_MIN,
): string | null {
  if (f.receiveDefaultBytes >= minBytes) return null;
  const kib = (n: number) =>
    n >= 2 ** 20 && n % 2 ** 20 === 0 ? `${n / 2 ** 20} MiB` : `${Math.round(n / 1024)} KiB`;
  const raise = f.settings.default.startsWith("net.core")
    ? `sysctl -w ${f.settings.max}=${Math.max(minBytes, f.receiveMaxBytes)} ` +
      `${f.settings.default}=${minBytes}`
    : `sysctl -w ${f.settings.max}=${Math.max(2 * minBytes, f.receiveMaxBytes)} ` +
      `${f.settings.default}=${minBytes}`;
  return `udp receive buffer: ${f.settings.default} is ${kib(f.receiveDefaultBytes)} ` +
    `(under ${kib(minBytes)}); QUIC drops datagrams when a receiver falls behind by more than ` +
    `that, and a handoff's last layer then crosses at a fraction of the link rate. Raise it ` +
    `(as root): ${raise}`;
}

/** `udpBufferAdvice` for this host (null: nothing to say, or the OS's settings unreadable). */
export async function hostUdpBufferAdvice(): Promise<string | null> {
  const facts = await readUdpBufferFacts();
  return facts && udpBufferAdvice(facts);
}
