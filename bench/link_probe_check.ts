/**
 * A live node's bandwidth probe (transport/link_probe.ts) through the link emulator, probe
 * sizes side by side: per rate and RTT (lossless), each size probed `--repeats` times on a
 * fresh connection through a fresh relay, and the estimates printed. It answers whether a
 * probe of that size reads the emulated rate, the input every link term of the cost model
 * scales with. Two workers on loopback (`super-mini`, idle); the decode worker sits behind the
 * relay, and this process probes it on the prefill worker's behalf, as the link matrix does.
 *
 *   deno run -A --unstable-net bench/link_probe_check.ts [--rates 100,400,1000] [--rtts 0.2,2]
 *     [--mib 3,8] [--repeats 5]
 *
 * @module
 */

import { parseArgs } from "node:util";
import { numberList } from "./cli_args.ts";
import { ensureModelFile } from "../models/mod.ts";
import { cacheDir } from "../cli/paths.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import { LinkMonitor } from "../transport/link_monitor.ts";
import { MATRIX_MODELS } from "./_matrix_point.ts";
import { buildNativeRelay, measureNativeCeiling, openGridLink } from "./native_relay.ts";

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      rates: { type: "string", default: "100,400,1000" },
      rtts: { type: "string", default: "0.2,2" },
      mib: { type: "string", default: "3,8" },
      repeats: { type: "string", default: "5" },
    },
  });
  const repeats = Number(values.repeats);
  if (!(Number.isInteger(repeats) && repeats > 0)) {
    throw new Error(`Invalid --repeats ${values.repeats}: give a positive integer`);
  }
  const binary = await buildNativeRelay();
  if (!binary) throw new Error("No C compiler: this check needs the native relay (cc)");
  const ceiling = await measureNativeCeiling(binary);
  const model = await ensureModelFile(`${cacheDir()}/models`, MATRIX_MODELS["super-mini"]);
  const cluster = await startLocalCluster({
    args: ["--model", model, "--ctx", "1024", "--threads", "1"],
  });
  const decode = cluster.decode.peer;
  try {
    for (const rate of numberList("--rates", values.rates)) {
      for (const rttMs of numberList("--rtts", values.rtts)) {
        for (const mib of numberList("--mib", values.mib)) {
          const read: string[] = [];
          for (let rep = 0; rep < repeats; rep++) {
            const point = { rateBitsPerS: rate * 1e6, rttMs, lossFraction: 0 };
            const link = await openGridLink(binary, decode, point, {
              ceilingBitsPerS: ceiling.bitsPerS,
              seed: 7 + rep,
            });
            try {
              const links = new LinkEstimator();
              const monitor = new LinkMonitor(cluster.prefill.peer.nodeId, links, {
                pingsPerMeasure: 10,
              });
              const host = { host: link.endpoint.hostname, port: link.endpoint.port };
              const conn = await cluster.client.connect({ ...decode, ...host });
              await monitor.measure(conn, Math.round(mib * 2 ** 20));
              await conn.close();
              const e = links.estimate(
                { from: cluster.prefill.peer.nodeId, to: decode.nodeId },
                performance.now(),
              );
              read.push(((e?.bandwidthBytesPerS ?? 0) / 1e6).toFixed(1));
            } finally {
              link.close();
            }
          }
          const rateMBps = (rate / 8).toFixed(1);
          console.log(
            `${rate}M (${rateMBps} MB/s) ${rttMs}ms probe ${mib} MiB: ${read.join(" ")} MB/s`,
          );
        }
      }
    }
    console.log(`relay native, ceiling ${Math.round(ceiling.bitsPerS / 1e6)} Mbit/s`);
  } finally {
    await cluster.stop();
  }
}
