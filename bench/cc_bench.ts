/**
 * Which QUIC congestion controller holds up under loss on an emulated link: one raw QUIC
 * stream of `bytes` through the link relay, Cubic ("default") against BBR ("low-latency"),
 * with and without loss, repeats interleaved so machine load falls on both alike. Part of
 * `--only link`, and standalone: `deno run -A --unstable-net bench/cc_bench.ts --help`.
 */
import { benchArgs, numberList } from "./cli_args.ts";
import { createEphemeralTlsCertificate } from "../transport/tls.ts";
import { connectQuicRaw, listenQuicRaw } from "../transport/quic.ts";
import { buildNativeRelay, measureNativeCeiling, openLink } from "./native_relay.ts";
import { median } from "./stats.ts";

export interface CcRow {
  congestionControl: "default" | "low-latency";
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
  /** Median over the repeats. */
  mbPerS: number;
  /** Share of the emulated line rate achieved (median). */
  ofLineRate: number;
  /** Every repeat's share, in run order. */
  runs: number[];
}

type Cc = CcRow["congestionControl"];

/** Runs every controller x loss point at `rateBitsPerS` and `rttMs`. */
export async function runCcComparison(
  o: {
    rateBitsPerS: number;
    rttMs: number;
    losses: number[];
    bytes: number;
    ceilingBitsPerS: number;
    /** The native relay's binary, or null for the TypeScript relay. */
    relayBinary: string | null;
    /** Repeats per point; the median is reported. */
    repeats?: number;
  },
): Promise<CcRow[]> {
  const certificate = await createEphemeralTlsCertificate();
  const runs = new Map<string, number[]>();
  for (let rep = 0; rep < (o.repeats ?? 1); rep++) {
    for (const lossFraction of o.losses) {
      for (const cc of ["default", "low-latency"] as const) {
        const mbPerS = await _once(o, cc, lossFraction, certificate, rep);
        const key = `${cc} ${lossFraction}`;
        runs.set(key, [...(runs.get(key) ?? []), mbPerS]);
      }
    }
  }
  const rows: CcRow[] = [];
  for (const congestionControl of ["default", "low-latency"] as const) {
    for (const lossFraction of o.losses) {
      const mb = runs.get(`${congestionControl} ${lossFraction}`)!;
      const share = (x: number) => (x * 8e6) / o.rateBitsPerS;
      rows.push({
        congestionControl,
        rateBitsPerS: o.rateBitsPerS,
        rttMs: o.rttMs,
        lossFraction,
        mbPerS: median(mb),
        ofLineRate: share(median(mb)),
        runs: mb.map(share),
      });
    }
  }
  return rows;
}

async function _once(
  o: Parameters<typeof runCcComparison>[0],
  congestionControl: Cc,
  lossFraction: number,
  certificate: Awaited<ReturnType<typeof createEphemeralTlsCertificate>>,
  rep: number,
): Promise<number> {
  const listener = listenQuicRaw({ certificate, congestionControl });
  const link = await openLink(o.relayBinary, {
    target: { hostname: "127.0.0.1", port: listener.addr.port },
    rateBitsPerS: o.rateBitsPerS,
    oneWayDelayMs: o.rttMs / 2,
    lossFraction,
    queueBytesMax: Math.max(32 * 1024, (o.rateBitsPerS / 8) * 0.05),
    ceilingBitsPerS: o.ceilingBitsPerS,
    seed: 3 + rep,
  });
  try {
    const [client, server] = await Promise.all([
      connectQuicRaw({
        hostname: link.endpoint.hostname,
        port: link.endpoint.port,
        serverCertificateSha256: certificate.sha256,
        congestionControl,
        maxIdleTimeoutMs: 10_000,
      }),
      listener.accept(),
    ]);
    const page = new Uint8Array(64 * 1024).fill(1);
    const started = performance.now();
    const channel = await client.openChannel();
    const receiving = (async () => {
      const incoming = (await server!.acceptChannel())!;
      let got = 0;
      for await (const chunk of incoming.readable) {
        got += chunk.length;
        if (got >= o.bytes) break;
      }
    })();
    const writer = channel.writable.getWriter();
    for (let sent = 0; sent < o.bytes; sent += page.length) {
      await writer.ready;
      await writer.write(page);
    }
    await receiving;
    const mbPerS = o.bytes / 1e6 / ((performance.now() - started) / 1000);
    client.close();
    return mbPerS;
  } finally {
    link.close();
    listener.close();
  }
}

if (import.meta.main) {
  const v = benchArgs("cc_bench.ts", {
    rates: { default: "100,400,1000", what: "Mbit/s" },
    "rtt-ms": { default: "2" },
    losses: { default: "0,0.001,0.01" },
    mib: { default: "32" },
    repeats: { default: "3" },
  });
  const binary = await buildNativeRelay();
  const ceiling = binary ? await measureNativeCeiling(binary) : null;
  const load = await Deno.readTextFile("/proc/loadavg").catch(() => "?");
  console.log(
    `relay ${binary ? "native" : "typescript"}; ceiling ${
      ceiling ? (ceiling.bitsPerS / 1e6).toFixed(0) : "?"
    } Mbit/s; load ${load.trim()}`,
  );
  for (const mbit of numberList("--rates", v.rates)) {
    const rows = await runCcComparison({
      rateBitsPerS: mbit * 1e6,
      rttMs: numberList("--rtt-ms", v["rtt-ms"])[0],
      losses: numberList("--losses", v.losses),
      bytes: numberList("--mib", v.mib)[0] * 2 ** 20,
      ceilingBitsPerS: ceiling?.bitsPerS ?? 40e6,
      relayBinary: binary,
      repeats: numberList("--repeats", v.repeats)[0],
    });
    for (const r of rows) {
      console.log(
        `${mbit} Mbit/s rtt ${r.rttMs} ms loss ${r.lossFraction * 100}% ${
          r.congestionControl === "default" ? "Cubic" : "BBR  "
        } ${r.mbPerS.toFixed(1)} MB/s = ${r.ofLineRate.toFixed(2)} of line rate (runs ${
          r.runs.map((x) => x.toFixed(2)).join(" ")
        })`,
      );
    }
  }
  console.log(`load after ${(await Deno.readTextFile("/proc/loadavg").catch(() => "?")).trim()}`);
}
