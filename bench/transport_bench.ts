/**
 * Transport benchmark: what framing, checksums and credit cost on top of raw QUIC.
 *
 * - Raw QUIC stream throughput vs framed + credited handoff-stream throughput, in the same
 *   run and the same setup (sender and receiver in this one process, so on one JS thread;
 *   absolute MB/s are lower than across two processes, the ratio is the point).
 * - Connection setup: raw QUIC connect vs connect + authentication + capability exchange.
 * - Framing CPU: encode (checksum included) and byte-fed decode, in MB/s.
 *
 * Standalone: `deno run -A --unstable-net bench/transport_bench.ts [--mib 128] [--repeats 3]`.
 * Never asserted in tests.
 */
import { median, table } from "./stats.ts";
import { benchArgs, orExit, wholeNumber } from "./cli_args.ts";
import { encodeFrame, FrameDecoder } from "../transport/frame.ts";
import { createEphemeralNodeIdentity } from "../transport/node_identity.ts";
import { establishPeer } from "../transport/establish.ts";
import type { PeerOptions } from "../transport/peer.ts";
import { connectQuicRaw, listenQuicRaw, type RawListener } from "../transport/quic.ts";
import { createEphemeralTlsCertificate, type TlsCertificate } from "../transport/tls.ts";
import { TrustList } from "../transport/trust.ts";

export interface TransportBenchOptions {
  /** Bytes per transfer, in MiB (64-256 is representative of a long-context state). */
  transferMiB?: number;
  /** Transfers per path; medians are reported. */
  repeats?: number;
  /** Payload bytes per frame (one KV page). */
  pageBytes?: number;
  /** Connections measured for the handshake cost. */
  handshakeRepeats?: number;
}

export interface TransportBenchResult {
  transferBytes: number;
  pageBytes: number;
  repeats: number;
  rawMBps: number[];
  framedMBps: number[];
  rawMBpsMedian: number;
  framedMBpsMedian: number;
  /** framed / raw: 1.0 means framing and credit cost nothing measurable. */
  framedToRawRatio: number;
  rawConnectMsMedian: number;
  authenticatedConnectMsMedian: number;
  /** authenticated - raw: authentication plus capability exchange. */
  authenticationMsMedian: number;
  encodeMBps: number;
  decodeMBps: number;
}

const MB = 1e6;

export interface Setup {
  certificate: TlsCertificate;
  listener: RawListener;
  client: PeerOptions;
  server: PeerOptions;
}

/** Two ephemeral nodes that trust each other and a raw QUIC listener (for other benches too). */
export async function benchPeers(): Promise<Setup> {
  const certificate = await createEphemeralTlsCertificate();
  const [a, b] = [await createEphemeralNodeIdentity(), await createEphemeralNodeIdentity()];
  const [ta, tb] = [TrustList.inMemory(), TrustList.inMemory()];
  await ta.add({ publicKey: b.publicKey });
  await tb.add({ publicKey: a.publicKey });
  return {
    certificate,
    listener: listenQuicRaw({ certificate }),
    client: { identity: a, trust: ta, capabilities: { roles: ["prefill"] } },
    server: { identity: b, trust: tb, capabilities: { roles: ["decode"] } },
  };
}

/** A raw connection to the bench listener. */
export function connectRaw(setup: Setup) {
  return connectQuicRaw({
    hostname: "127.0.0.1",
    port: setup.listener.addr.port,
    serverCertificateSha256: setup.certificate.sha256,
  });
}

/** One raw stream: `bytes` in `pageBytes` writes; MB/s from first write to last byte read. */
export async function rawTransfer(setup: Setup, bytes: number, pageBytes: number): Promise<number> {
  const [client, server] = await Promise.all([connectRaw(setup), setup.listener.accept()]);
  const page = new Uint8Array(pageBytes).fill(1);
  const started = performance.now();
  const channel = await client.openChannel();
  const receiving = (async () => {
    const incoming = (await server!.acceptChannel())!;
    let got = 0;
    for await (const chunk of incoming.readable) {
      got += chunk.length;
      if (got >= bytes) break;
    }
    return got;
  })();
  const writer = channel.writable.getWriter();
  for (let sent = 0; sent < bytes; sent += pageBytes) {
    await writer.ready;
    await writer.write(page);
  }
  await receiving;
  const seconds = (performance.now() - started) / 1000;
  client.close();
  return bytes / MB / seconds;
}

/** One handoff stream: framed, checksummed, credited, until the receiver's receipt. */
async function _framedTransfer(setup: Setup, bytes: number, pageBytes: number): Promise<number> {
  const [clientRaw, serverRaw] = await Promise.all([connectRaw(setup), setup.listener.accept()]);
  const [client, server] = await Promise.all([
    establishPeer(clientRaw, "client", setup.client),
    establishPeer(serverRaw!, "server", setup.server),
  ]);
  const page = new Uint8Array(pageBytes).fill(1);
  const started = performance.now();
  const sender = await client.openHandoffStream({ handoffId: "bench" });
  const receiving = (async () => {
    const receiver = (await server.acceptHandoffStream())!.accept();
    let got = 0;
    for await (const frame of receiver) got += frame.payload.length;
    return got;
  })();
  for (let seq = 0; seq * pageBytes < bytes; seq++) {
    await sender.send({ type: "StateChunk", seq }, page);
  }
  await sender.finish();
  await receiving;
  const seconds = (performance.now() - started) / 1000;
  await client.close();
  return bytes / MB / seconds;
}

async function _connectTimes(
  setup: Setup,
  repeats: number,
): Promise<{ raw: number[]; authenticated: number[] }> {
  const raw: number[] = [];
  const authenticated: number[] = [];
  for (let i = 0; i < repeats + 1; i++) {
    let t0 = performance.now();
    const [c1, s1] = await Promise.all([connectRaw(setup), setup.listener.accept()]);
    const rawMs = performance.now() - t0;
    c1.close();
    s1?.close();
    t0 = performance.now();
    const [c2, s2] = await Promise.all([connectRaw(setup), setup.listener.accept()]);
    const [client] = await Promise.all([
      establishPeer(c2, "client", setup.client),
      establishPeer(s2!, "server", setup.server),
    ]);
    const authMs = performance.now() - t0;
    await client.close();
    if (i === 0) continue; // the first connect of a process pays one-time setup
    raw.push(rawMs);
    authenticated.push(authMs);
  }
  return { raw, authenticated };
}

/** Encode and byte-fed decode rates over 64 MiB of 4 MiB frames, fed in 64 KiB slices. */
function _framingRates(): { encodeMBps: number; decodeMBps: number } {
  const payload = new Uint8Array(4 << 20).fill(7);
  const frames = 16;
  let t0 = performance.now();
  const encoded = Array.from(
    { length: frames },
    (_, seq) => encodeFrame({ type: "StateChunk", seq }, payload),
  );
  const encodeMBps = frames * payload.length / MB / ((performance.now() - t0) / 1000);
  const slices = encoded.flatMap((frame) => {
    const out = [frame.head];
    for (let at = 0; at < frame.payload.length; at += 65536) {
      out.push(frame.payload.subarray(at, at + 65536));
    }
    return out;
  });
  t0 = performance.now();
  const decoder = new FrameDecoder();
  for (const slice of slices) decoder.push(slice);
  const decodeMBps = frames * payload.length / MB / ((performance.now() - t0) / 1000);
  return { encodeMBps, decodeMBps };
}

/** Runs the transport benchmark and returns its measurements (print with `formatTransportBench`). */
export async function runTransportBench(
  options: TransportBenchOptions = {},
): Promise<TransportBenchResult> {
  const transferBytes = (options.transferMiB ?? 128) * 1024 * 1024;
  const pageBytes = options.pageBytes ?? 4 * 1024 * 1024;
  const repeats = options.repeats ?? 3;
  const setup = await benchPeers();
  try {
    const rawMBps: number[] = [];
    const framedMBps: number[] = [];
    // Interleaved, so drift (thermal, other load) hits both paths alike.
    for (let i = 0; i < repeats; i++) {
      rawMBps.push(await rawTransfer(setup, transferBytes, pageBytes));
      framedMBps.push(await _framedTransfer(setup, transferBytes, pageBytes));
    }
    const connect = await _connectTimes(setup, options.handshakeRepeats ?? 10);
    const framing = _framingRates();
    const rawConnectMsMedian = median(connect.raw);
    const authenticatedConnectMsMedian = median(connect.authenticated);
    return {
      transferBytes,
      pageBytes,
      repeats,
      rawMBps,
      framedMBps,
      rawMBpsMedian: median(rawMBps),
      framedMBpsMedian: median(framedMBps),
      framedToRawRatio: median(framedMBps) / median(rawMBps),
      rawConnectMsMedian,
      authenticatedConnectMsMedian,
      authenticationMsMedian: authenticatedConnectMsMedian - rawConnectMsMedian,
      ...framing,
    };
  } finally {
    setup.listener.close();
  }
}

/** Plain-text tables of a result. */
export function formatTransportBench(r: TransportBenchResult): string {
  const mib = r.transferBytes / 1024 / 1024;
  return [
    `transfer ${mib} MiB in ${r.pageBytes / 1024 / 1024} MiB pages, ${r.repeats} repeats (medians)`,
    table(["path", "MB/s", "samples"], [
      ["raw QUIC stream", r.rawMBpsMedian, r.rawMBps.map((x) => x.toFixed(0)).join(" ")],
      ["framed + credited", r.framedMBpsMedian, r.framedMBps.map((x) => x.toFixed(0)).join(" ")],
      ["ratio framed/raw", r.framedToRawRatio, ""],
    ]),
    "",
    table(["connection setup", "ms (median)"], [
      ["raw QUIC connect", r.rawConnectMsMedian],
      ["connect + auth + capabilities", r.authenticatedConnectMsMedian],
      ["authentication cost", r.authenticationMsMedian],
    ]),
    "",
    table(["framing CPU", "MB/s"], [["encode (with CRC32C)", r.encodeMBps], [
      "decode (64 KiB slices)",
      r.decodeMBps,
    ]]),
  ].join("\n");
}

if (import.meta.main) {
  const values = benchArgs("transport_bench.ts", {
    mib: { default: "128", what: "MiB per transfer" },
    repeats: { default: "3" },
  });
  const result = await runTransportBench({
    transferMiB: orExit(() => wholeNumber("--mib", values.mib, 1, 4096)),
    repeats: orExit(() => wholeNumber("--repeats", values.repeats, 1, 100)),
  });
  console.log(formatTransportBench(result));
}
