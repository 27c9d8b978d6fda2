/**
 * Handoffs under an unauthenticated handshake flood, attacker in its own process (as on a real
 * network): two workers as child processes on loopback, a baseline of handoffs, then the same
 * handoffs while a separate flooder process opens `--connections` QUIC connections to both
 * workers that complete TLS, send 10 bytes and stall. Reports: tokens equal the baseline, the
 * added end-to-end latency (medians), both workers still alive and holding nothing.
 *
 * `deno run -A --unstable-net bench/flood_run.ts [--connections 200] [--handoffs 3]`
 * (127.0.0.1 only: it floods nothing but the workers it started.)
 */
import { runHandoff } from "../serve/coordinator.ts";
import { clusterRequest } from "./cluster_request.ts";
import { type LocalCluster, type LocalWorker, startLocalCluster } from "../serve/local_cluster.ts";
import { queryStats } from "../serve/stats.ts";
import { ALPN_PROTOCOL } from "../transport/quic.ts";
import { ensureModelFile } from "../models/mod.ts";
import { cacheDir } from "../cli/paths.ts";
import { benchArgs, orExit, wholeNumber } from "./cli_args.ts";
import { median } from "./stats.ts";

const FLOOD_CONCURRENCY = 40;

/** Flooder mode (a child process): `--flood host:port:sha256hex,...`. */
async function flood(targets: string[], connections: number): Promise<void> {
  const endpoint = new Deno.QuicEndpoint({ hostname: "127.0.0.1", port: 0 });
  const conns: Deno.QuicConn[] = [];
  let opened = 0;
  let started = 0;
  const one = async () => {
    while (started < connections) {
      const [host, port, sha] = targets[started++ % targets.length].split(":");
      try {
        const conn = await Deno.connectQuic({
          hostname: host,
          port: Number(port),
          alpnProtocols: [ALPN_PROTOCOL],
          endpoint,
          serverCertificateHashes: [{
            algorithm: "sha-256",
            value: Uint8Array.from(sha.match(/../g)!.map((h) => parseInt(h, 16))).buffer,
          }],
        } as Deno.ConnectQuicOptions<false>);
        conns.push(conn);
        const stream = await conn.createBidirectionalStream();
        await stream.writable.getWriter().write(
          new Uint8Array([0x53, 0x44, 1, 0, 0, 0, 0, 9, 0, 0]), // then nothing
        );
        opened++;
      } catch {
        // Refused or cut by the worker: that is the point.
      }
    }
  };
  await Promise.all(Array.from({ length: FLOOD_CONCURRENCY }, one));
  console.log(JSON.stringify({ opened, attempted: started }));
  await Promise.all(conns.map((c) => c.closed.catch(() => {})));
  endpoint.close();
}

function alive(worker: LocalWorker): Promise<boolean> {
  return Promise.race([
    worker.process.status.then(() => false),
    new Promise<boolean>((resolve) => setTimeout(() => resolve(true), 50)),
  ]);
}

async function main(): Promise<void> {
  const values = benchArgs("flood_run.ts", {
    connections: { default: "200" },
    handoffs: { default: "3" },
    flood: { default: "", what: "host:port:sha256hex,... (internal: the flooder process)" },
  });
  const connections = orExit(() => wholeNumber("--connections", values.connections, 1, 10_000));
  const handoffs = orExit(() => wholeNumber("--handoffs", values.handoffs, 1, 100));
  if (values.flood) return await flood(values.flood.split(","), connections);

  const model = await ensureModelFile(`${cacheDir()}/models`, {
    family: "hybrid",
    preset: "tiny",
    seed: 1,
  });
  const cluster = await startLocalCluster({ args: ["--model", model] });
  try {
    const targets = _floodTargets(cluster);
    const warm = await _handoff(cluster); // connects and authenticates the coordinator's links
    const baseline: _Run[] = [];
    for (let i = 0; i < handoffs; i++) baseline.push(await _handoff(cluster));
    const flooder = _startFlooder(targets, connections);
    await new Promise((resolve) => setTimeout(resolve, 300)); // the flood is under way
    const flooded: _Run[] = [];
    for (let i = 0; i < handoffs; i++) flooded.push(await _handoff(cluster));
    const out = await flooder.output();
    const floodLine = new TextDecoder().decode(out.stdout).trim().split("\n").at(-1);
    const floodPanicked = /panicked/.test(new TextDecoder().decode(out.stderr));
    const equal = [...baseline, ...flooded].every((r) =>
      r.tokens === warm.tokens && r.placement === "disaggregated"
    );
    const workersAlive = [await alive(cluster.prefill), await alive(cluster.decode)];
    const held = await _heldByWorkers(cluster);
    console.log(JSON.stringify(
      {
        connections,
        flood: floodLine ? JSON.parse(floodLine) : null,
        flooderPanicked: floodPanicked,
        handoffs,
        baselineMedianMs: Math.round(median(baseline.map((r) => r.ms))),
        underFloodMedianMs: Math.round(median(flooded.map((r) => r.ms))),
        addedMs: Math.round(median(flooded.map((r) => r.ms)) - median(baseline.map((r) => r.ms))),
        tokensEqualAndDisaggregated: equal,
        workersAlive,
        held,
      },
      null,
      1,
    ));
  } finally {
    await cluster.stop();
  }
}

/** Both workers as flood targets: `host:port:sha256hex` of their pinned certificates. */
function _floodTargets(cluster: LocalCluster): string[] {
  const sha = (nodeId: string) => {
    const pin = cluster.client.trust.lookup(nodeId)?.certificateSha256;
    if (!pin) throw new Error(`no certificate pin for ${nodeId}`);
    return typeof pin === "string"
      ? pin
      : Array.from(pin, (b: number) => b.toString(16).padStart(2, "0")).join("");
  };
  return [cluster.prefill.peer, cluster.decode.peer].map((p) =>
    `127.0.0.1:${p.port}:${sha(p.nodeId)}`
  );
}

const _PROMPT = "The quick brown fox jumps over the lazy dog. ".repeat(40);

type _Run = Awaited<ReturnType<typeof _handoff>>;

/** One handoff of the fixed prompt: end-to-end time, tokens and placement. */
async function _handoff(cluster: LocalCluster) {
  const t0 = performance.now();
  const r = await runHandoff(
    cluster.client,
    clusterRequest(cluster, _PROMPT, {
      generateTokens: 32,
      tenantId: "flood",
      timeoutMs: 60_000,
    }),
  );
  return { ms: performance.now() - t0, tokens: r.tokens.join(","), placement: r.placement };
}

/** This script again as the flooder, in a process of its own. */
function _startFlooder(targets: string[], connections: number): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--unstable-net",
      new URL(import.meta.url).pathname,
      "--flood",
      targets.join(","),
      "--connections",
      String(connections),
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/** What each worker still holds after the flood (retained, staged, busy contexts). */
async function _heldByWorkers(cluster: LocalCluster) {
  const held = [];
  for (const w of [cluster.prefill, cluster.decode]) {
    const link = await cluster.client.connect(w.peer);
    const s = await queryStats(link, 5_000);
    held.push({
      retainedBytes: s.retainedBytes,
      stagedBytes: s.stagedBytes,
      busy: s.contextsBusy,
    });
    await link.close();
  }
  return held;
}

if (import.meta.main) await main();
