/**
 * The cost model's link terms alone, without llama.cpp's compute: over every point of the
 * issue's grid (through the native relay), one raw QUIC connection measures its RTT (pings)
 * and its bandwidth (one bounded probe) as a node does, predicts `bytes / bandwidth + RTT` for
 * transfers of handoff-sized payloads, and times them (first byte written to the receiver's
 * one-byte acknowledgement back). This is the part of TTFT and the tail that the link decides;
 * prefill and the decoder's probe step are compute, measured separately.
 *
 *   deno run -A --unstable-net bench/link_transfer_check.ts [--mib 1,11,44]
 *     [--rates 100,400,1000] [--rtts 0.2,2,10] [--losses 0,0.001] [--out FILE.json]
 */
import { benchArgs, numberList } from "./cli_args.ts";
import { createEphemeralTlsCertificate } from "../transport/tls.ts";
import { connectQuicRaw, listenQuicRaw } from "../transport/quic.ts";
import type { RawConnection } from "../transport/channel.ts";
import { buildNativeRelay, measureNativeCeiling, openLink } from "./native_relay.ts";
import { median } from "./stats.ts";

export interface TransferCheckRow {
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
  refused: string | null;
  measuredRttMs: number | null;
  probeBytesPerS: number | null;
  transfers: { bytes: number; predictedMs: number; measuredMs: number }[];
  loadAvg1m: number;
}

/** Server side: per stream, an 8-byte length, that many bytes, then one byte back. */
async function _serve(conn: RawConnection): Promise<void> {
  for (;;) {
    const ch = await conn.acceptChannel();
    if (!ch) return;
    (async () => {
      const reader = ch.readable.getReader();
      let want = -1, got = 0;
      const head = new Uint8Array(8);
      let headGot = 0;
      while (want < 0 || got < want) {
        const { value, done } = await reader.read();
        if (done) return;
        let v = value;
        if (want < 0) {
          const take = Math.min(8 - headGot, v.length);
          head.set(v.subarray(0, take), headGot);
          headGot += take;
          v = v.subarray(take);
          if (headGot < 8) continue;
          want = Number(new DataView(head.buffer).getBigUint64(0));
        }
        got += v.length;
      }
      const w = ch.writable.getWriter();
      await w.write(new Uint8Array([1]));
      await w.close();
    })().catch(() => {});
  }
}

/** Sends `bytes` on a new stream and waits for the one-byte acknowledgement. */
async function _timed(conn: RawConnection, bytes: number): Promise<number> {
  const t0 = performance.now();
  const ch = await conn.openChannel();
  const w = ch.writable.getWriter();
  const head = new Uint8Array(8);
  new DataView(head.buffer).setBigUint64(0, BigInt(bytes));
  await w.write(head);
  const page = new Uint8Array(256 * 1024);
  for (let sent = 0; sent < bytes; sent += page.length) {
    await w.ready;
    await w.write(page.subarray(0, Math.min(page.length, bytes - sent)));
  }
  const reader = ch.readable.getReader();
  await reader.read();
  return performance.now() - t0;
}

async function _load(): Promise<number> {
  try {
    return Number((await Deno.readTextFile("/proc/loadavg")).split(" ")[0]);
  } catch {
    return NaN;
  }
}

export async function runTransferCheck(o: {
  mib: number[];
  rates: number[];
  rtts: number[];
  losses: number[];
  log?: (r: TransferCheckRow) => void;
}): Promise<{ ceilingBitsPerS: number | null; relay: string; rows: TransferCheckRow[] }> {
  const binary = await buildNativeRelay();
  const ceiling = binary ? await measureNativeCeiling(binary) : null;
  const certificate = await createEphemeralTlsCertificate();
  const rows: TransferCheckRow[] = [];
  for (const rate of o.rates) {
    for (const rttMs of o.rtts) {
      for (const lossFraction of o.losses) {
        const row: TransferCheckRow = {
          rateBitsPerS: rate,
          rttMs,
          lossFraction,
          refused: null,
          measuredRttMs: null,
          probeBytesPerS: null,
          transfers: [],
          loadAvg1m: await _load(),
        };
        rows.push(row);
        await _checkPoint(row, o.mib, { binary, ceiling, certificate });
        o.log?.(row);
      }
    }
  }
  return {
    ceilingBitsPerS: ceiling?.bitsPerS ?? null,
    relay: binary ? "native" : "typescript",
    rows,
  };
}

/**
 * One grid point: a raw QUIC pair through the relay at `row`'s rate, RTT and loss, measured and
 * then each of `mib` transferred, into `row` (`row.refused` where the relay refuses the point).
 */
async function _checkPoint(
  row: TransferCheckRow,
  mib: number[],
  r: {
    binary: string | null;
    ceiling: { bitsPerS: number } | null;
    certificate: Awaited<ReturnType<typeof createEphemeralTlsCertificate>>;
  },
): Promise<void> {
  const rate = row.rateBitsPerS;
  const listener = listenQuicRaw({ certificate: r.certificate, maxIdleTimeoutMs: 10_000 });
  let link;
  try {
    link = await openLink(r.binary, {
      target: { hostname: "127.0.0.1", port: listener.addr.port },
      rateBitsPerS: rate,
      oneWayDelayMs: row.rttMs / 2,
      lossFraction: row.lossFraction,
      queueBytesMax: Math.max(64 * 1024, (rate / 8) * 0.05),
      ceilingBitsPerS: r.ceiling?.bitsPerS ?? 40e6,
      seed: 5,
    });
  } catch (error) {
    row.refused = (error as Error).message.split(":")[0];
    listener.close();
    return;
  }
  try {
    const [client, server] = await Promise.all([
      connectQuicRaw({
        hostname: link.endpoint.hostname,
        port: link.endpoint.port,
        serverCertificateSha256: r.certificate.sha256,
        maxIdleTimeoutMs: 10_000,
      }),
      listener.accept(),
    ]);
    _serve(server!);
    await _measureTransfers(client, row, mib);
    client.close();
  } finally {
    link.close();
    listener.close();
  }
}

/** Pings and a probe as a node takes them, then each transfer predicted from them and timed. */
async function _measureTransfers(
  client: RawConnection,
  row: TransferCheckRow,
  mib: number[],
): Promise<void> {
  const rate = row.rateBitsPerS;
  const pings: number[] = [];
  for (let k = 0; k < 10; k++) pings.push(await _timed(client, 0));
  row.measuredRttMs = median(pings);
  const probeBytes = Math.round(Math.min(16 << 20, Math.max(2 << 20, (rate / 8) * 0.25)));
  // As the node's probe (transport/link_probe.ts): the first half ramps the congestion
  // window up and is not timed, the second half is.
  const half = Math.round(probeBytes / 2);
  await _timed(client, half);
  const probeMs = await _timed(client, half);
  row.probeBytesPerS = half / Math.max(1e-3, probeMs - row.measuredRttMs) * 1000;
  for (const m of mib) {
    const bytes = Math.round(m * 2 ** 20);
    const predictedMs = (bytes / row.probeBytesPerS) * 1000 + row.measuredRttMs;
    row.transfers.push({ bytes, predictedMs, measuredMs: await _timed(client, bytes) });
  }
}

if (import.meta.main) {
  const v = benchArgs("link_transfer_check.ts", {
    mib: { default: "1,11,44" },
    rates: { default: "100,400,1000", what: "Mbit/s" },
    rtts: { default: "0.2,2,10" },
    losses: { default: "0,0.001" },
    out: { default: "", what: "FILE.json" },
  });
  const r = await runTransferCheck({
    mib: numberList("--mib", v.mib),
    rates: numberList("--rates", v.rates).map((m) => m * 1e6),
    rtts: numberList("--rtts", v.rtts),
    losses: numberList("--losses", v.losses),
    log: (x) =>
      console.log(
        `${x.rateBitsPerS / 1e6}M ${x.rttMs}ms ${x.lossFraction * 100}% load ${x.loadAvg1m} ` +
          (x.refused ??
            `rtt ${x.measuredRttMs?.toFixed(2)} probe ${
                ((x.probeBytesPerS ?? 0) / 1e6).toFixed(1)
              } MB/s ` +
              x.transfers.map((t) =>
                `${(t.bytes / 2 ** 20).toFixed(0)}MiB ${t.predictedMs.toFixed(0)}/${
                  t.measuredMs.toFixed(0)
                } (${((t.predictedMs / t.measuredMs - 1) * 100).toFixed(0)}%)`
              ).join(" ")),
      ),
  });
  const errs = r.rows.flatMap((x) => x.transfers.map((t) => t.predictedMs / t.measuredMs - 1));
  console.log(
    `relay ${r.relay}, ceiling ${((r.ceilingBitsPerS ?? 0) / 1e6).toFixed(0)} Mbit/s; ${
      errs.filter((e) => Math.abs(e) <= 0.15).length
    }/${errs.length} transfers predicted within 15%`,
  );
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(r));
}
