/**
 * The cost model against emulated links, the issue's whole grid: rates 100 Mbit/s, 400 Mbit/s
 * and 1 Gbit/s, RTT 0.2, 2 and 10 ms, loss 0 and 0.1%, through the native relay
 * (native_relay.ts), on `super-mini` (512 to 32K tokens) and `lab-state` (512 to 4K).
 *
 *   deno run -A --unstable-net bench/link_matrix.ts --model super-mini|lab-state
 *     [--prompts 512,2048,8192,32768] [--rates 100,400,1000] [--rtts 0.2,2,10]
 *     [--losses 0,0.001] [--repeats 1] [--worker-threads 1] [--decode-cpu-quota 0.33]
 *     [--pin-workers split|on|off] [--certification FILE] [--bandwidth-min-mbps N]
 *     [--out FILE.json]
 *
 * Rate 0 is the loopback itself (no relay). `--decode-cpu-quota` limits the decode worker to a
 * fraction of one core (bench/cpu_quota.ts: a slower decoder with the same numerics, where a
 * handoff can win); `--pin-workers` places the parts where two CPUs stand in for two machines
 * (bench/cpu_pin.ts): `split` (the default where there are two CPUs) gives the prefill
 * worker's compute CPU 0 alone and puts its other threads, the relay (at rates it sustains
 * there) and the decode worker on CPU 1; `on` gives each worker process a CPU of its own (the
 * runs of 2026-12-04 evening); `off` lets everything float (runs before those);
 * `--certification` is the file the planner reads, as `coordinate` does (without it no family
 * is certified and every decision is colocated); `--bandwidth-min-mbps` replaces the planner's
 * link floor.
 *
 * Per link point the link is measured as a live node measures it (pings and one bounded probe
 * through the relay); node rates and the decoder's commit costs come from the handoffs already
 * served in this run (calibration in the same run, as the nodes themselves learn them: the
 * planner never uses constants); then `placeRequest()` predicts TTFT and the tail and one
 * handoff runs through the relay, whatever the decision, to be compared. Prompts are the outer
 * loop so the prefill rate a prediction uses was measured minutes, not an hour, before.
 * Machine load (/proc/loadavg) is recorded with every row.
 */
import { parseArgs } from "node:util";
import { numberList } from "./cli_args.ts";
import { baseHandoffRequest, promptsOfTokens } from "./link_bench.ts";
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { ISSUE_GRID } from "./link_matrix_grid.ts";
import type { HandoffRequest } from "../serve/coordinator.ts";
import { cacheDir } from "../cli/paths.ts";
import { buildNativeRelay, measureNativeCeiling, type NativeCeiling } from "./native_relay.ts";
import type { ThreadPinner } from "./cpu_pin.ts";
import type { LocalCluster } from "../serve/local_cluster.ts";
import { type CertificationFile, parseCertification } from "../core/certification.ts";
import { CONGESTION_CONTROLS, type CongestionControl, type PlanOptions } from "../core/planner.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";

import {
  limitDecodeCpu,
  matrixContext,
  onStopSignal,
  pinWorkers,
  relaySharedCeiling,
  startMatrixCluster,
} from "./_matrix_setup.ts";
import {
  learnFrom,
  MATRIX_MODELS,
  type MatrixContext,
  type MatrixPoint,
  type MatrixRow,
  runPoint,
} from "./_matrix_point.ts";

export type { MatrixPoint, MatrixRow };

/** One unshaped calibration run at a prompt: the handoff's record and the colocated TTFT. */
export interface CalibrationRun {
  promptTokens: number;
  telemetry: HandoffTelemetry;
  colocatedTtftMs: number;
  colocatedTpotMs: number | null;
  /** The unshaped handoff's TTFT on the client's clock. */
  clientTtftMs?: number;
}

const MODELS = MATRIX_MODELS;

/** What a link matrix run measures, and how the parts are placed. */
export interface LinkMatrixOptions {
  model: keyof typeof MODELS;
  prompts: number[];
  points: MatrixPoint[];
  repeats: number;
  /**
   * llama.cpp threads per worker. Both workers and the relay share this machine's cores: one
   * thread each stands in for two machines; two each put four spinning compute threads on two
   * cores whenever both decode at once (the prefiller's and the decoder's continuation probes
   * overlap), and a barrier then waits for a descheduled thread (probe steps of 22 ms to 1.5 s
   * measured on one idle machine).
   */
  workerThreads?: number;
  /**
   * The decode worker limited to this fraction of one core (bench/cpu_quota.ts): a slower
   * decoder with the same numerics, so the measurement can show where disaggregation wins.
   */
  decodeCpuQuota?: number;
  /**
   * Which CPU each part runs on (bench/cpu_pin.ts), so two worker processes stand in for two
   * machines: `split` puts the prefill worker's compute alone on CPU 0, and its other threads
   * (QUIC), the relay and the decode worker on CPU 1; `whole` puts each worker on a CPU of its
   * own and lets the relay float. Absent: everything floats. This process always floats.
   */
  pinWorkers?: "split" | "whole";
  /**
   * The certification file the planner reads (`correctness state-handoff --certify`), as
   * `coordinate` does; absent: no family is certified, and every decision is colocated.
   */
  certification?: CertificationFile;
  /** Planner thresholds other than the defaults (core/planner.ts DEFAULT_PLAN_OPTIONS). */
  planOptions?: Partial<PlanOptions>;
  /** The controller both workers send with (`serve --congestion-control`); default "cubic". */
  congestionControl?: CongestionControl;
  log?: (row: MatrixRow) => void;
  /** Written after every row, so a run cut short keeps what it measured. */
  outFile?: string;
}

/** What `runLinkMatrix` returns (its JSON file has more: the run's options). */
export interface LinkMatrixResult {
  ceiling: NativeCeiling | null;
  relay: string;
  rows: MatrixRow[];
  calibration: CalibrationRun[];
  /**
   * A calibration one prefill chunk deep, where every prompt is deeper: without it a run of one
   * prompt length gives the planner one depth, and it takes the prefill rate as flat.
   */
  shallowCalibration: CalibrationRun[];
}

export async function runLinkMatrix(o: LinkMatrixOptions): Promise<LinkMatrixResult> {
  const model = await ensureModelFile(`${cacheDir()}/models`, MODELS[o.model]);
  const binary = await buildNativeRelay();
  const ceiling = binary ? await measureNativeCeiling(binary) : null;
  const relayShared = await relaySharedCeiling(binary, o.pinWorkers);
  const promptFor = await promptsOfTokens(model);
  const cluster = await startMatrixCluster(
    model,
    Math.max(...o.prompts),
    o.workerThreads,
    o.congestionControl ?? "cubic",
  );
  const rows: MatrixRow[] = [];
  const calibration: CalibrationRun[] = [];
  const shallowCalibration: CalibrationRun[] = [];
  const quota = await limitDecodeCpu(cluster, o.decodeCpuQuota);
  const pinner = await pinWorkers(cluster, o.pinWorkers, quota);
  // One stop, shared by the run's end and an interrupting signal (bench/_matrix_setup.ts).
  let stopping: Promise<void> | null = null;
  const stop = () =>
    stopping ??= (async () => {
      pinner?.stop();
      await cluster.stop();
      await quota?.release();
    })();
  const signals = onStopSignal(stop);
  try {
    const base = baseHandoffRequest(cluster, 600_000);
    const x = matrixContext(o, cluster, binary, ceiling, relayShared);
    const chunk = RUNTIME_DEFAULTS.chunkTokens;
    if (Math.min(...o.prompts) > chunk) {
      // As a node that has served short prompts knows: the rate one chunk deep.
      await _calibrate(
        x,
        { ...base, prompt: promptFor(chunk) } as HandoffRequest,
        shallowCalibration,
      );
    }
    for (const n of o.prompts) {
      const request = { ...base, prompt: promptFor(n) } as HandoffRequest;
      await _calibrate(x, request, calibration);
      const actual = calibration[calibration.length - 1]?.promptTokens ?? n;
      for (let rep = 0; rep < o.repeats; rep++) {
        for (const p of o.points) {
          const row = await runPoint(x, p, n, actual, rep, request);
          row.colocatedTtftMs = calibration.at(-1)?.colocatedTtftMs ?? null;
          rows.push(row);
          o.log?.(row);
          if (o.outFile) {
            await _writeRunFile(o.outFile, o, { ceiling, binary, relayShared, pinner, cluster }, {
              rows,
              calibration,
              shallowCalibration,
            });
          }
        }
      }
    }
  } finally {
    signals.remove();
    await stop();
  }
  const relay = binary ? "native" : "typescript";
  return { ceiling, relay, rows, calibration, shallowCalibration };
}

/**
 * Calibration in this run: an unshaped handoff and a colocated run at this prompt, twice
 * (the first warms both workers up and is not learned from).
 */
async function _calibrate(
  x: MatrixContext,
  request: HandoffRequest,
  calibration: CalibrationRun[],
): Promise<void> {
  for (let k = 0; k < 2; k++) {
    const d = await runHandoff(x.cluster.client, request);
    const c = await runHandoff(x.cluster.client, { ...request, colocated: true });
    if (k === 0) continue;
    calibration.push({
      promptTokens: d.telemetry.promptTokens,
      telemetry: d.telemetry,
      colocatedTtftMs: c.ttftMs,
      colocatedTpotMs: c.telemetry.tpotMs,
      clientTtftMs: d.ttftMs,
    });
    learnFrom(x, d.telemetry, d.ttftMs, 0); // unshaped loopback: the link hides nothing
    x.decodeRates.recordPrefill(d.telemetry.promptTokens, c.ttftMs);
    for (const t of [c.telemetry, d.telemetry]) {
      if (t.tpotMs) x.decodeRates.recordDecode(1, t.tpotMs, d.telemetry.promptTokens);
    }
  }
}

/** The run file, rewritten after every row so a run cut short keeps what it measured. */
async function _writeRunFile(
  outFile: string,
  o: LinkMatrixOptions,
  run: {
    ceiling: NativeCeiling | null;
    binary: string | null;
    relayShared: NativeCeiling | null;
    pinner: ThreadPinner | null;
    cluster: LocalCluster;
  },
  measured: Pick<LinkMatrixResult, "rows" | "calibration" | "shallowCalibration">,
): Promise<void> {
  await Deno.writeTextFile(
    outFile,
    JSON.stringify({
      ceiling: run.ceiling,
      relay: run.binary ? "native" : "typescript",
      workerThreads: o.workerThreads ?? null,
      decodeCpuQuota: o.decodeCpuQuota ?? null,
      pinWorkers: o.pinWorkers ?? false,
      // With `split`, each point's probe left from the prefill worker's network CPU.
      probeCpu: o.pinWorkers === "split" ? 1 : null,
      relaySharedCeiling: run.relayShared,
      // The newest failure to keep a new prefill thread where `split` puts it.
      pinError: run.pinner?.lastError ?? null,
      planOptions: o.planOptions ?? {},
      congestionControl: o.congestionControl ?? "cubic",
      // The prefill worker's default: its capture sends the last page during the
      // last chunk (runs before this field existed sent it after).
      lastPageCapture: true,
      // How each worker's memory was paged (a worker where glibc did not take its huge-page
      // tunable: "advised"; runs before this field existed drew that per process).
      hugePages: { prefill: run.cluster.prefill.hugePages, decode: run.cluster.decode.hugePages },
      rows: measured.rows,
      calibration: measured.calibration,
      shallowCalibration: measured.shallowCalibration,
    }),
  );
}

if (import.meta.main) {
  const { values: v } = parseArgs({
    args: Deno.args,
    options: {
      model: { type: "string", default: "super-mini" },
      prompts: { type: "string" },
      rates: { type: "string", default: ISSUE_GRID.ratesBitsPerS.map((r) => r / 1e6).join(",") },
      rtts: { type: "string", default: ISSUE_GRID.rttsMs.join(",") },
      losses: { type: "string", default: ISSUE_GRID.lossFractions.join(",") },
      repeats: { type: "string", default: "1" },
      "worker-threads": { type: "string", default: "1" },
      "decode-cpu-quota": { type: "string" },
      "pin-workers": { type: "string", default: "split" },
      certification: { type: "string" },
      "bandwidth-min-mbps": { type: "string" },
      "congestion-control": { type: "string", default: "cubic" },
      out: { type: "string", default: "" },
      help: { type: "boolean", default: false },
    },
  });
  if (v.help) {
    console.log(
      "deno run -A --unstable-net bench/link_matrix.ts --model super-mini|lab-state " +
        "[--prompts 512,2048,8192,32768] [--rates 100,400,1000] [--rtts 0.2,2,10] " +
        "[--losses 0,0.001] [--repeats 1] [--worker-threads 1] [--decode-cpu-quota 0.33] " +
        "[--pin-workers split|on|off] [--congestion-control cubic|bbr] " +
        "[--certification FILE] [--bandwidth-min-mbps N] [--out FILE.json]  " +
        "(--rates 0: no relay, the loopback itself; N: the planner's link floor in MB/s)",
    );
    Deno.exit(0);
  }
  const model = v.model as keyof typeof MODELS;
  if (!MODELS[model]) {
    console.error(`error: unknown --model ${model} (use super-mini or lab-state)`);
    Deno.exit(2);
  }
  const quota = v["decode-cpu-quota"] === undefined
    ? undefined
    : numberList("--decode-cpu-quota", v["decode-cpu-quota"])[0];
  if (quota !== undefined && !(quota > 0 && quota <= 1)) {
    console.error(`error: --decode-cpu-quota ${quota}: use a fraction of one core in (0, 1]`);
    Deno.exit(2);
  }
  const pin = v["pin-workers"]!;
  if (pin !== "split" && pin !== "on" && pin !== "off") {
    console.error(`error: --pin-workers ${pin}: use split, on or off`);
    Deno.exit(2);
  }
  const cc = v["congestion-control"] as CongestionControl;
  if (!CONGESTION_CONTROLS.includes(cc)) {
    console.error(`error: --congestion-control ${cc}: use cubic or bbr`);
    Deno.exit(2);
  }
  const twoCpus = navigator.hardwareConcurrency >= 2;
  const pinWorkers = !twoCpus || pin === "off" ? undefined : pin === "on" ? "whole" : "split";
  if (pin !== "off" && !twoCpus) {
    console.error("workers not pinned: this machine has one CPU (--pin-workers needs two)");
  }
  const points: MatrixPoint[] = [];
  for (const r of numberList("--rates", v.rates)) {
    if (r === 0) {
      points.push({ rateBitsPerS: 0, rttMs: 0, lossFraction: 0 }); // the loopback, unshaped
      continue;
    }
    for (const rtt of numberList("--rtts", v.rtts)) {
      for (const loss of numberList("--losses", v.losses)) {
        points.push({ rateBitsPerS: r * 1e6, rttMs: rtt, lossFraction: loss });
      }
    }
  }
  const f = (v: number | null | undefined) => (v == null ? "-" : v.toFixed(0));
  const result = await runLinkMatrix({
    model,
    prompts: numberList(
      "--prompts",
      v.prompts ?? (ISSUE_GRID.prompts[model] ?? ISSUE_GRID.prompts["super-mini"]).join(","),
    ),
    points,
    repeats: numberList("--repeats", v.repeats)[0],
    workerThreads: numberList("--worker-threads", v["worker-threads"])[0],
    decodeCpuQuota: quota,
    pinWorkers,
    congestionControl: cc,
    ...(v["bandwidth-min-mbps"]
      ? {
        planOptions: {
          bandwidthBytesPerSMin: numberList("--bandwidth-min-mbps", v["bandwidth-min-mbps"])[0] *
            1e6,
        },
      }
      : {}),
    ...(v.certification
      ? {
        certification: parseCertification(
          JSON.parse(await Deno.readTextFile(v.certification)),
          v.certification,
        ),
      }
      : {}),
    outFile: v.out || undefined,
    log: (r) =>
      console.log(
        `${r.rateBitsPerS / 1e6}M ${r.rttMs}ms ${r.lossFraction * 100}% n=${r.promptTokens} ` +
          (r.refused
            ? `REFUSED ${r.refused}`
            : `ttft ${f(r.predicted?.ttftMs)}/${f(r.measured?.ttftMs)} ` +
              `colocated ${f(r.predicted?.colocatedTtftMs)}/${f(r.colocatedTtftMs)} ` +
              `tail ${f(r.predicted?.tailMs)}/${f(r.measured?.tailMs)} ` +
              `xfer ${f(r.predicted?.transferMs)}/${f(r.measured?.transferMs)} ` +
              `commit ${f(r.predicted?.commitMs)}/${f(r.measured?.commitMs)} ` +
              `rtt ${r.predicted?.rttMs?.toFixed(2)}/${
                r.measured?.commitRoundTripMs?.toFixed(1)
              } ` +
              `bw ${((r.link.bytesPerS ?? 0) / 1e6).toFixed(1)}MB/s planned ${
                ((r.planned?.bandwidthBytesPerS ?? 0) / 1e6).toFixed(1)
              }MB/s (${r.planned?.source ?? "-"}) wire ${f(r.measured?.wireMs)} ` +
              `bytes ${((r.measured?.totalBytes ?? 0) / 1e6).toFixed(1)}MB staged ${
                r.measured?.stagedEarly?.toFixed(2) ?? "n/a"
              } ` +
              `prefill ${f(r.measured?.prefillMs)} lead ${f(r.telemetry?.captureLeadMs)} ` +
              `udp drops ${r.udp?.receiveDrops} ` +
              `relay drops ${r.relay?.drops} late ${r.relay?.lateUsMean.toFixed(0)}us load ${
                r.loadAvg1m.toFixed(2)
              } ${r.decision}`),
      ),
  });
  console.log(
    `relay ${result.relay}, ceiling ${((result.ceiling?.bitsPerS ?? 0) / 1e6).toFixed(0)} Mbit/s`,
  );
}
