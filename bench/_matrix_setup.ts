/**
 * How the link matrix (link_matrix.ts) starts and places its parts: the two workers, the decode
 * worker's CPU quota, the CPUs each part runs on, the planner context every point shares, and
 * what stops the workers when the run is interrupted.
 */
import { exitStatusOf, listenForStop } from "../cli/stop_signal.ts";
import { type LocalCluster, startLocalCluster } from "../serve/local_cluster.ts";
import { llamaBuild, loadLlama } from "../ffi/mod.ts";
import { RateRecorder } from "../core/node_rates.ts";
import type { CongestionControl } from "../core/planner.ts";
import { HandoffCostRecorder } from "../core/link_costs.ts";
import { measureNativeCeiling, type NativeCeiling } from "./native_relay.ts";
import { limitCpu } from "./cpu_quota.ts";
import { computeApart, pinToCpu, ThreadPinner } from "./cpu_pin.ts";
import { DEFAULT_CEILING_SHARE } from "./link_emulator.ts";
import { type MatrixContext, recurrentLayersOf } from "./_matrix_point.ts";
import type { LinkMatrixOptions } from "./link_matrix.ts";

/**
 * `split`: the relay shares CPU 1 with the prefiller's sending and the decoder where, measured
 * with its own sender and sink on that one CPU, it keeps the rate with the relay's margin.
 */
export async function relaySharedCeiling(
  binary: string | null,
  pinWorkers: LinkMatrixOptions["pinWorkers"],
): Promise<NativeCeiling | null> {
  const relayShared = binary && pinWorkers === "split"
    ? await measureNativeCeiling(binary, 100_000, 3, 1)
    : null;
  if (relayShared) {
    console.error(
      `relay on CPU 1 up to ${
        (relayShared.bitsPerS * DEFAULT_CEILING_SHARE / 1e6).toFixed(0)
      } Mbit/s ` +
        `(ceiling there ${(relayShared.bitsPerS / 1e6).toFixed(0)}); above it, it floats`,
    );
  }
  return relayShared;
}

export function startMatrixCluster(
  model: string,
  maxPrompt: number,
  workerThreads: number | undefined,
  congestionControl: CongestionControl,
): Promise<LocalCluster> {
  return startLocalCluster({
    args: [
      "--model",
      model,
      "--ctx",
      String(maxPrompt + 512),
      "--congestion-control",
      congestionControl,
      ...(workerThreads ? ["--threads", String(workerThreads)] : []),
    ],
    // The bench's own link probe is sent as the prefill worker sends the state.
    clientLink: { congestionControl },
    // The matrix measures each row's link itself, as a node does (pings, the 8 MiB probe, the
    // loss probe); the prefill worker's own background measurement would overlap the next row.
    prefillArgs: ["--link-probe-age-ms", "0"],
  });
}

/** The decode worker under a CPU quota (bench/cpu_quota.ts); the cluster is stopped on failure. */
export async function limitDecodeCpu(cluster: LocalCluster, decodeCpuQuota: number | undefined) {
  const quota = decodeCpuQuota
    ? await limitCpu(cluster.decode.process.pid, decodeCpuQuota).catch(async (error) => {
      await cluster.stop();
      throw error;
    })
    : null;
  if (quota) console.error(`decode worker limited: ${quota.describe}`);
  return quota;
}

/**
 * Places the workers on CPUs (bench/cpu_pin.ts); the thread pinner that keeps `split` in place
 * (null otherwise). On failure the cluster is stopped and the quota released.
 */
export async function pinWorkers(
  cluster: LocalCluster,
  pinWorkers: LinkMatrixOptions["pinWorkers"],
  quota: { release(): Promise<void> } | null,
): Promise<ThreadPinner | null> {
  let pinner: ThreadPinner | null = null;
  if (pinWorkers) {
    try {
      if (pinWorkers === "split") {
        console.error(`pinned: ${await pinToCpu(cluster.decode.process.pid, 1)}`);
        pinner = await ThreadPinner.start(cluster.prefill.process.pid, computeApart(0, 1));
        console.error(
          `pinned: process ${cluster.prefill.process.pid}'s compute threads on CPU 0, ` +
            `its other threads on CPU 1 (threads by CPU now: ${JSON.stringify(pinner.counts())})`,
        );
      } else {
        for (const [w, cpu] of [[cluster.prefill, 0], [cluster.decode, 1]] as const) {
          console.error(`pinned: ${await pinToCpu(w.process.pid, cpu)}`);
        }
      }
    } catch (error) {
      await cluster.stop();
      await quota?.release();
      throw new Error(`${(error as Error).message} (or run with --pin-workers off)`);
    }
  }
  return pinner;
}

/**
 * Stops the workers when the run is interrupted (SIGINT, SIGTERM; a second signal exits at once,
 * `cli/stop_signal.ts`), then exits with the shell's status for that signal. A signal ends this
 * process without running its `finally` blocks, and the worker processes it started would outlive
 * it. `stop` must be safe to call twice: the run's own `finally` may call it while the listener's
 * call is still under way. `remove()` takes the listeners away again.
 */
export function onStopSignal(stop: () => Promise<void>): { remove(): void } {
  return listenForStop((signal) => {
    console.error(`${signal}: stopping the workers`);
    stop().finally(() => Deno.exit(exitStatusOf(signal)));
  });
}

export function matrixContext(
  o: LinkMatrixOptions,
  cluster: LocalCluster,
  binary: string | null,
  ceiling: NativeCeiling | null,
  relayShared: NativeCeiling | null,
): MatrixContext {
  return {
    cluster,
    binary,
    ceilingBitsPerS: ceiling?.bitsPerS ?? 40e6,
    // The newest 3 samples per depth bucket: this shared machine's load moves within minutes.
    prefillRates: new RateRecorder(cluster.prefill.peer.nodeId, 3),
    decodeRates: new RateRecorder(cluster.decode.peer.nodeId, 3),
    costs: new HandoffCostRecorder(),
    linkCosts: new Map(),
    lossByPoint: new Map(),
    transfersByPoint: new Map(),
    state: { kvBytesPerToken: 0, recurrentBytes: 0, recurrentLayers: recurrentLayersOf(o.model) },
    model: o.model,
    certification: o.certification ?? null,
    planOptions: o.planOptions ?? {},
    congestionControl: o.congestionControl ?? "cubic",
    llamaBuild: llamaBuild(loadLlama()),
    relayCpu: relayShared
      ? { cpu: 1, bitsPerSMax: relayShared.bitsPerS * DEFAULT_CEILING_SHARE }
      : null,
    probeCpu: o.pinWorkers === "split" ? 1 : null,
  };
}
