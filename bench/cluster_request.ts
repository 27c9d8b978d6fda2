/**
 * The handoff request the benches send between a local cluster's two workers: greedy, no probe,
 * a generous timeout (a loaded machine stretches prefills). `over` changes what a bench varies.
 */
import type { HandoffRequest } from "../serve/coordinator.ts";
import type { LocalCluster } from "../serve/local_cluster.ts";

export function clusterRequest(
  cluster: LocalCluster,
  prompt: string,
  over: Partial<HandoffRequest> = {},
): HandoffRequest {
  return {
    prefill: cluster.prefill.peer,
    decode: cluster.decode.peer,
    prompt,
    generateTokens: 2,
    sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
    tenantId: "bench",
    probe: false,
    timeoutMs: 600_000,
    ...over,
  };
}
