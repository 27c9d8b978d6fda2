/**
 * Which QUIC congestion controller holds up under loss on an emulated link: one raw QUIC
 * stream of `bytes` through the link emulator, Cubic ("default") against BBR ("low-latency"),
 * with and without loss. Part of `--only link`; the transport's default is left alone and the
 * result is reported for the lead to decide.
 */
import { createEphemeralTlsCertificate } from "../transport/tls.ts";
import { connectQuicRaw, listenQuicRaw } from "../transport/quic.ts";
import { LinkEmulator } from "./link_emulator.ts";

export interface CcRow {
  congestionControl: "default" | "low-latency";
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
  mbPerS: number;
  /** Share of the emulated line rate achieved. */
  ofLineRate: number;
}

/** Runs every controller x loss point at `rateBitsPerS` and `rttMs`. */
export async function runCcComparison(
  o: {
    rateBitsPerS: number;
    rttMs: number;
    losses: number[];
    bytes: number;
    ceilingBitsPerS: number;
  },
): Promise<CcRow[]> {
  const certificate = await createEphemeralTlsCertificate();
  const rows: CcRow[] = [];
  for (const congestionControl of ["default", "low-latency"] as const) {
    for (const lossFraction of o.losses) {
      const listener = listenQuicRaw({ certificate, congestionControl });
      const link = new LinkEmulator({
        target: { hostname: "127.0.0.1", port: listener.addr.port },
        rateBitsPerS: o.rateBitsPerS,
        oneWayDelayMs: o.rttMs / 2,
        lossFraction,
        queueBytesMax: Math.max(32 * 1024, (o.rateBitsPerS / 8) * 0.05),
        ceilingBitsPerS: o.ceilingBitsPerS,
        seed: 3,
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
        rows.push({
          congestionControl,
          rateBitsPerS: o.rateBitsPerS,
          rttMs: o.rttMs,
          lossFraction,
          mbPerS,
          ofLineRate: (mbPerS * 8e6) / o.rateBitsPerS,
        });
        client.close();
      } finally {
        link.close();
        listener.close();
      }
    }
  }
  return rows;
}
