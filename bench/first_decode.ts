/**
 * What a first decode costs on this machine, in one process, one llama.cpp thread, on lab-state
 * (the continuation probes on both sides are such first decodes; docs/bench-report/lab/):
 * a decode step in a loop, the first 1-token decode after a full prefill chunk, the first after a
 * staged import into another context (the decoder's path), the first after
 * `llama_state_seq_set`, and what touching freshly mapped memory costs against touching it
 * again. Not a test: numbers move between runs; each line prints every repeat and the median.
 *
 *   deno run -A bench/first_decode.ts [--repeats 3] [--model <gguf>]  (default: lab-state, seed 1)
 *
 * Prints counts and milliseconds only.
 */
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { exportKvPage, exportRecurrent } from "../ffi/state.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import { median } from "./stats.ts";
import { benchArgs, modelOrLabState, orExit, wholeNumber } from "./cli_args.ts";

const CHUNK = 256;

const values = benchArgs("first_decode.ts", {
  repeats: { default: "3" },
  model: { default: "", what: "GGUF (default: lab-state, made once)" },
});
const repeats = orExit(() => wholeNumber("--repeats", values.repeats, 1, 20));
const modelPath = await modelOrLabState(values.model || undefined);
const config = {
  ...RUNTIME_DEFAULTS,
  modelPath,
  nCtx: Math.ceil(((repeats + 2) * (CHUNK + 8)) / 256) * 256,
  chunkTokens: CHUNK,
  threads: 1,
};
const tokens = (n: number, salt: number) =>
  new Int32Array(n).map((_, i) => 100 + ((i + salt) * 7) % 200);
const timed = async (f: () => Promise<unknown>) => {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
};
const show = (label: string, xs: number[]) =>
  console.log(
    `${label}: median ${median(xs).toFixed(1)} ms (${xs.map((x) => x.toFixed(1)).join(", ")})`,
  );

using a = await Engine.open(config);
using b = await Engine.open(config, a.model);
const afterChunk: number[] = [], loop: number[] = [];
for (let r = 0; r < repeats; r++) {
  await a.prefill(tokens(CHUNK, r));
  afterChunk.push(await timed(() => a.step(42)));
  for (let k = 0; k < 3; k++) loop.push(await timed(() => a.step(43 + k)));
}
show(`first decode after a ${CHUNK}-token chunk`, afterChunk);
show("decode step in a loop", loop);

// The decoder's two ways in: a staged import (the handoff's) and llama's own state set.
await a.wipe();
await a.prefill(tokens(CHUNK, 99));
const page = await exportKvPage(a.ctx, 0, CHUNK);
const snapshot = await exportRecurrent(a.ctx);
const blob = await a.ctx.stateSeqGet(0, 0);
const afterStaged: number[] = [], afterSet: number[] = [];
for (let r = 0; r < repeats; r++) {
  await b.wipe();
  const imp = await StagedImport.open(b.ctx, { nTokens: CHUNK });
  await imp.addPage(page);
  await imp.setRecurrent(snapshot);
  await imp.validate();
  await imp.commit();
  b.adoptPosition(CHUNK);
  afterStaged.push(await timed(() => b.step(42)));
  await b.wipe();
  await b.ctx.stateSeqSet(blob, 0, 0);
  b.adoptPosition(CHUNK);
  afterSet.push(await timed(() => b.step(42)));
}
show("first decode after a staged import", afterStaged);
show("first decode after llama_state_seq_set", afterSet);

// The recurrent state's size, mapped fresh and filled, then filled again.
const bytes = 172_687_360;
const fresh: number[] = [], again: number[] = [];
for (let r = 0; r < repeats; r++) {
  let buf: Uint8Array | null = null;
  fresh.push(await timed(() => Promise.resolve(buf = new Uint8Array(bytes).fill(1))));
  again.push(await timed(() => Promise.resolve(buf!.fill(2))));
}
show(`${bytes} B freshly allocated and filled`, fresh);
show(`the same ${bytes} B filled again`, again);
console.log(
  `touching a fresh 4 KiB page: ${(median(fresh) - median(again)) / (bytes / 4096) * 1000} us`,
);
