/**
 * What the link checks share (link_probe_check.ts, link_loss_check.ts): the native relay and its
 * measured ceiling, and two idle `super-mini` workers on loopback, one llama.cpp thread each, the
 * prefill worker's own link measurement off (the check measures on its behalf, as the link
 * matrix does).
 *
 * @module
 */
import { ensureModelFile } from "../models/mod.ts";
import { cacheDir } from "../cli/paths.ts";
import { type LocalCluster, startLocalCluster } from "../serve/local_cluster.ts";
import { MATRIX_MODELS } from "./_matrix_point.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import { LinkMonitor } from "../transport/link_monitor.ts";
import type { PeerConnection } from "../transport/peer.ts";
import {
  buildNativeRelay,
  type GridPoint,
  measureNativeCeiling,
  type NativeCeiling,
  openGridLink,
} from "./native_relay.ts";

/** Builds the relay, measures its ceiling and starts the two workers. */
export async function startRelayCheck(): Promise<
  { binary: string; ceiling: NativeCeiling; cluster: LocalCluster }
> {
  const binary = await buildNativeRelay();
  if (!binary) throw new Error("No C compiler: this check needs the native relay (cc)");
  const ceiling = await measureNativeCeiling(binary);
  const model = await ensureModelFile(`${cacheDir()}/models`, MATRIX_MODELS["super-mini"]);
  const cluster = await startLocalCluster({
    args: ["--model", model, "--ctx", "1024", "--threads", "1", "--link-probe-age-ms", "0"],
  });
  return { binary, ceiling, cluster };
}

/**
 * A fresh relay shaping `point` in front of the decode worker (loss seeded with `seed`), and a
 * connection through it measured for the prefill worker's pair (ten pings per measure). `close()`
 * closes both.
 */
export async function throughRelay(
  check: { binary: string; ceiling: NativeCeiling; cluster: LocalCluster },
  point: GridPoint,
  seed: number,
): Promise<{ conn: PeerConnection; monitor: LinkMonitor; close: () => Promise<void> }> {
  const decode = check.cluster.decode.peer;
  const link = await openGridLink(check.binary, decode, point, {
    ceilingBitsPerS: check.ceiling.bitsPerS,
    seed,
  });
  try {
    const monitor = new LinkMonitor(check.cluster.prefill.peer.nodeId, new LinkEstimator(), {
      pingsPerMeasure: 10,
    });
    const host = { host: link.endpoint.hostname, port: link.endpoint.port };
    const conn = await check.cluster.client.connect({ ...decode, ...host });
    return {
      conn,
      monitor,
      close: async () => {
        await conn.close().catch(() => {});
        link.close();
      },
    };
  } catch (error) {
    link.close();
    throw error;
  }
}
