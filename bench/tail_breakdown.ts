/**
 * Where one lab-state handoff's tail goes, handoff by handoff (not medians): prefill end to the
 * manifest leaving, the decoder's verify + import, its probe, and how long its probe result
 * waited for the prefiller's probe digest. Used for docs/bench-report/lab/ on a loaded machine.
 *
 * `deno run -A --unstable-net bench/tail_breakdown.ts [--runs 3] [--sentences 25] [--capture on]
 * [--per-cluster 1] [--threads N] [--ctx 1024] [--last-page-capture on|off] [--huge-pages on|off]`: `--per-cluster` handoffs on each process pair (more than one:
 * the later ones run on warm workers, as in serving, where the prefiller's own probe decode can
 * be what CommitAck waits for); `--threads` llama.cpp threads per worker (default: the workers');
 * `--ctx` each worker's context (tokens; raise it with `--sentences`).
 * Prints one line per handoff: counts and milliseconds only.
 */
import { cacheDir } from "../cli/paths.ts";
import { ensureModelFile } from "../models/mod.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { LAB_SENTENCE, LAB_TIMEOUT_ARGS, labHandoff } from "./lab_tail_bench.ts";
import { benchArgs, orExit, wholeNumber } from "./cli_args.ts";
const values = benchArgs("tail_breakdown.ts", {
  runs: { default: "3" },
  sentences: { default: "25" },
  capture: { default: "on", what: "on|off" },
  "per-cluster": { default: "1", what: "handoffs per process pair" },
  threads: { default: "", what: "N (default: the workers')" },
  ctx: { default: "1024", what: "tokens" },
  "last-page-capture": { default: "on", what: "on|off" },
  "huge-pages": { default: "on", what: "on|off" },
});
const runs = orExit(() => wholeNumber("--runs", values.runs, 1, 100));
const sentences = orExit(() => wholeNumber("--sentences", values.sentences, 1, 10_000));
const perCluster = orExit(() => wholeNumber("--per-cluster", values["per-cluster"], 1, 100));
const model = await ensureModelFile(`${cacheDir()}/models`, {
  family: "hybrid",
  preset: "lab-state",
  seed: 1,
});
const ms = (x: number | null | undefined) => (x ?? NaN).toFixed(0);
for (let i = 0; i < runs; i++) {
  const cluster = await startLocalCluster({
    args: [
      ...["--model", model, "--ctx", values.ctx, "--layer-capture", values.capture],
      ...["--last-page-capture", values["last-page-capture"]],
      ...["--huge-pages", values["huge-pages"]],
      ...LAB_TIMEOUT_ARGS,
      ...(values.threads ? ["--threads", values.threads] : []),
    ],
  });
  try {
    for (let j = 0; j < perCluster; j++) {
      const r = await labHandoff(cluster, LAB_SENTENCE.repeat(sentences));
      const t = r.telemetry;
      const tail = t.uncoveredTailMs ?? NaN;
      const probe = t.probeMs ?? NaN;
      const wait = t.probeWaitMs ?? 0;
      console.log(
        `${r.placement} prompt ${r.promptTokens} load ${Deno.loadavg()[0].toFixed(1)}: tail ${
          ms(tail)
        } ms, decoder probe ${ms(probe)}, probe wait ${ms(t.probeWaitMs)}, tail-probe ${
          ms(tail - probe)
        }, before manifest ${ms(tail - (t.commitRoundTripMs ?? NaN))}, verify+import ${
          ms((t.commitMs ?? NaN) - probe - wait)
        }, prefill ${ms(t.prefillMs)}, cluster ${i} handoff ${j}`,
      );
    }
  } finally {
    await cluster.stop();
  }
}
