/**
 * Tests only: the API in front of a local cluster (serve/local_cluster.ts) on loopback, its one
 * prefill and one decode worker as peers, a free port, the hang bound as the workers' idle
 * timeout; each test says only what it changes (placement, keys, live placement).
 */
import type { LocalCluster } from "../serve/local_cluster.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { HANG_MS } from "../testing/bounds.ts";
import { PeerSet } from "./peers.ts";
import { type ApiServer, type ApiServerOptions, startApiServer } from "./server.ts";

export function startClusterApi(
  cluster: LocalCluster,
  modelPath: string,
  options: Partial<ApiServerOptions> & Pick<ApiServerOptions, "placement" | "keys">,
): Promise<ApiServer> {
  return startApiServer({
    hostname: "127.0.0.1",
    port: 0,
    node: cluster.client,
    modelPath,
    nCtx: RUNTIME_DEFAULTS.nCtx,
    peers: new PeerSet([
      { peer: cluster.prefill.peer, role: "prefill" },
      { peer: cluster.decode.peer, role: "decode" },
    ]),
    workerIdleTimeoutMs: HANG_MS,
    ...options,
  });
}
