/**
 * The `lab` bench section's table, notes and tail-vs-floor chart (the runs are in
 * lab_tail_bench.ts, whose header says what the floors are).
 */
import { type LabTailResult, type LabTailRow, runLabTailBench } from "./lab_tail_bench.ts";
import { table } from "./stats.ts";
import { lineChart } from "./svg.ts";

/** The `lab` section of `deno task bench`: table, notes and the tail-vs-floor chart. */
export async function labTailSection(o: { quick: boolean; modelDir: string }) {
  const r = await runLabTailBench(_labOptions(o));
  return {
    name: "lab",
    rows: r,
    table: _labTable(r.rows),
    notes: _labNotes(r),
    charts: { "lab-tail-vs-floor.svg": labTailChart(r.rows) },
  };
}

/** The lab run's options: the defaults of a full or `--quick` run, narrowed by the environment. */
function _labOptions(o: { quick: boolean; modelDir: string }) {
  // SKIPPY_LAB_PROMPTS / SKIPPY_LAB_SMALL_PAGES / SKIPPY_LAB_PAGE_AFTER / SKIPPY_LAB_CAPTURE_OFF
  // (comma-separated token counts, "" for none: capture on; on with 4 KiB pages; layers only
  // with the last page after prefill; off) and
  // SKIPPY_LAB_ONCE_FROM (prompts this long run once) narrow a run on a loaded machine;
  // SKIPPY_LAB_REPEATS sets the warm handoffs per row (default 2);
  // SKIPPY_LAB_THREADS sets llama.cpp threads per worker (default: the runtime's).
  const sizes = (name: string, fallback: number[]) => {
    const v = Deno.env.get(name);
    return v === undefined ? fallback : v.split(",").filter(Boolean).map(Number);
  };
  return {
    modelDir: o.modelDir,
    promptTokens: sizes("SKIPPY_LAB_PROMPTS", o.quick ? [512] : [512, 2048, 8192]),
    captureOffTokens: sizes("SKIPPY_LAB_CAPTURE_OFF", o.quick ? [] : [512, 2048]),
    pageAfterTokens: sizes("SKIPPY_LAB_PAGE_AFTER", o.quick ? [] : [512, 2048]),
    smallPagesTokens: sizes("SKIPPY_LAB_SMALL_PAGES", o.quick ? [] : [512, 2048]),
    payloadTokens: 2048,
    repeats: sizes("SKIPPY_LAB_REPEATS", [o.quick ? 1 : 2])[0],
    payloadRepeats: o.quick ? 3 : 7,
    onceFromTokens: sizes("SKIPPY_LAB_ONCE_FROM", [8192])[0] ?? 8192,
    workerThreads: sizes("SKIPPY_LAB_THREADS", [])[0],
  };
}

function _labTable(rows: LabTailRow[]): string {
  return table(
    [
      "prompt",
      "runs",
      "capture",
      "pages",
      "workers",
      "prefill ms",
      "TTFT ms",
      "1st tok after prefill ms",
      "tail ms",
      "probe ms",
      "tail-probe ms",
      "probe wait ms",
      "floor ms",
      "x floor",
      "layer floor ms",
      "x layer floor",
      "x at fastest raw",
    ],
    rows.map((x) => [
      x.promptTokens,
      x.repeats,
      x.capture,
      x.hugePages === false ? "4K" : "huge",
      x.workers ?? "warm",
      x.prefillMs,
      x.ttftMs,
      x.firstTokenAfterPrefillMs ?? NaN,
      x.tailMs,
      x.probeMs,
      x.tailToReadyMs,
      x.probeWaitMs,
      x.floorMs,
      x.tailToReadyMs / x.floorMs,
      x.layerFloorMs,
      x.tailToReadyMs / x.layerFloorMs,
      x.tailToReadyMs / x.layerFloorFastestMs,
    ]),
  );
}

/** The notes under the lab table: the geometry, the measured rates, how to read the columns. */
function _labNotes(r: LabTailResult): string[] {
  const p = r.payload;
  return [
    `lab-state hybrid (88 layers: 40 Mamba2 with d_inner 8192 / d_state 128, 8 attention with 2 KV heads x 128; hidden 64): 8,192 B/token of KV, 172,687,360 B recurrent. Raw QUIC ${
      r.rawMBps.toFixed(0)
    } MB/s and control round trip ${
      r.rttMs.toFixed(
        2,
      )
    } ms, measured in this run; the floors use that rate. \`x at fastest raw\`: tail - probe over the layer floor at the faster of that rate and the payload section's raw baseline (${
      Math.max(r.rawMBps, p.rawMBps).toFixed(0)
    } MB/s), the stricter reading. UDP receive buffer ${
      r.udp?.receiveDefaultBytes ?? "unknown"
    } B by default; datagrams the kernel dropped for a full one during the run (host-wide): ${
      r.udp?.receiveDrops ?? "unknown"
    } (docs/bench-report/lab/README.md, runs 23-26).`,
    "tail: prefill end -> CommitAck; probe: the decoder's continuation probe (one decode step, which also yields token 2's logits); the floors are compared with tail - probe. The manifest leaves when the last chunk is out; the prefiller's own probe decode runs after it and its digest follows (probe wait: how long the decoder's probe result waited for it). Medians of `runs` handoffs (one at 8K: its prefill takes minutes here). Each capture mode runs on its own process pair; that pair's first handoff (at the smallest prompt) is its own `cold` row, and the other rows are on `warm` workers, as in serving; the chart shows warm rows.",
    `Payload path on lab-state (${p.pages} real KV pages of ${p.pageTokens} tokens, ${
      (p.stateBytes / 1e6).toFixed(1)
    } MB: binding tag, framing, credit, CRC-32C check, append-import): ${
      p.payloadMBps.toFixed(0)
    } MB/s vs raw QUIC ${p.rawMBps.toFixed(0)} MB/s (medians of ${p.ratios.length}); ratio ${
      p.ratio.toFixed(2)
    } (median of the paired per-repeat ratios ${p.ratios.map((x) => x.toFixed(2)).join(", ")}).`,
    "capture: `on` sends the recurrent layers and the last page while the last chunk computes (the page once the last attention layer, 78 of 88, has written it); `layers` sends only the layers then (`--last-page-capture off`: the page leaves after the chunk); `off` sends the snapshot after prefill. pages: `huge` where the workers ask Linux for transparent huge pages on their contexts' buffers (the default), `4K` with `--huge-pages off`. The modes run one after another, each on its own process pair.",
    `Both workers and the client share two cores: sending while the last chunk computes competes with it (prefill ms, capture on vs off). llama.cpp threads per worker: ${
      r.workerThreads ?? "the runtime default"
    } (SKIPPY_LAB_THREADS).`,
  ];
}

/** Tail - probe of the warm rows against both floors, by prompt length (log x). */
export function labTailChart(rows: LabTailRow[]): string {
  const warm = rows.filter((x) => x.workers !== "cold");
  const on = warm.filter((x) => x.capture === "on" && x.hugePages !== false);
  const small = warm.filter((x) => x.capture === "on" && x.hugePages === false);
  const layersOnly = warm.filter((x) => x.capture === "layers");
  const off = warm.filter((x) => x.capture === "off");
  const pts = (rows: LabTailRow[], f: (x: LabTailRow) => number) =>
    rows.map((x) => ({ x: x.promptTokens, y: f(x) }));
  const series = (name: string, rows: LabTailRow[]) =>
    rows.length ? [{ name, points: pts(rows, (x) => x.tailToReadyMs) }] : [];
  return lineChart([
    { name: "tail - probe, capture on", points: pts(on, (x) => x.tailToReadyMs) },
    ...series("tail - probe, capture on, 4 KiB pages (--huge-pages off)", small),
    ...series("tail - probe, layers only (last page after)", layersOnly),
    ...series("tail - probe, layer capture off", off),
    { name: "floor (snapshot + last page)", points: pts(on, (x) => x.floorMs) },
    { name: "layer floor (last layer + last page)", points: pts(on, (x) => x.layerFloorMs) },
  ], {
    title: "lab-state: uncovered handoff tail vs its floors",
    xLabel: "prompt tokens",
    yLabel: "ms",
    logX: true,
  });
}
