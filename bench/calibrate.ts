/**
 * `deno task bench calibrate --model M --node-id ID [--depths 512,2048,8192] [--threads N]
 * [--out FILE]`: measures this machine's prefill and decode tokens/s at a few context depths
 * with the runtime the workers use, and writes (or updates, by node id) the calibration file
 * the planner reads (`plan --calibration FILE`; core/node_rates.ts). Run it on each lab machine;
 * until then the projection's rates are placeholders.
 */
import { parseArgs } from "node:util";
import {
  CALIBRATION_FILE_VERSION,
  type NodeRates,
  parseCalibration,
  RateRecorder,
} from "../core/node_rates.ts";
import { syntheticTokens } from "../models/mod.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";

/** Decode steps timed after each prefill. */
export const CALIBRATION_DECODE_STEPS = 16;

export interface CalibrateOptions {
  modelPath: string;
  nodeId: string;
  depths: number[];
  threads?: number;
}

/** Measures one node's rates: one cold prefill per depth, then a few decode steps there. */
export async function calibrate(o: CalibrateOptions): Promise<NodeRates> {
  const maxDepth = Math.max(...o.depths);
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: o.modelPath,
    nCtx: maxDepth + CALIBRATION_DECODE_STEPS + 256,
    threads: o.threads ?? RUNTIME_DEFAULTS.threads,
  });
  const rec = new RateRecorder(o.nodeId);
  for (const depth of o.depths) {
    const tokens = syntheticTokens(depth, engine.model.vocab.nTokens);
    engine.ctx.clearMemory();
    engine.adoptPosition(0);
    const t0 = performance.now();
    await engine.prefill(tokens);
    rec.recordPrefill(depth, performance.now() - t0);
    const t1 = performance.now();
    for (let i = 0; i < CALIBRATION_DECODE_STEPS; i++) await engine.step(tokens[i]);
    rec.recordDecode(CALIBRATION_DECODE_STEPS, performance.now() - t1, depth);
  }
  const r = rec.rates();
  return {
    ...r,
    source: "calibration",
    sourceNote: `bench calibrate ${new Date().toISOString()} on ${Deno.hostname()}, ${
      o.threads ?? RUNTIME_DEFAULTS.threads
    } threads`,
  };
}

/** Adds or replaces `node` in the calibration file at `path`. */
export async function writeCalibration(path: string, node: NodeRates): Promise<void> {
  let nodes: NodeRates[] = [];
  try {
    nodes = parseCalibration(JSON.parse(await Deno.readTextFile(path)), path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  nodes = [...nodes.filter((n) => n.nodeId !== node.nodeId), node];
  const file = {
    version: CALIBRATION_FILE_VERSION,
    nodes: nodes.map(({ nodeId, sourceNote, prefill, decode }) => ({
      nodeId,
      sourceNote,
      prefill,
      decode,
    })),
  };
  await Deno.writeTextFile(path, JSON.stringify(file, null, 2) + "\n");
}

export async function calibrateMain(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      "node-id": { type: "string" },
      depths: { type: "string", default: "512,2048,8192" },
      threads: { type: "string" },
      out: { type: "string", default: "calibration.json" },
    },
  });
  const depths = values.depths.split(",").map(Number);
  if (!values.model || !values["node-id"] || depths.some((d) => !(Number.isInteger(d) && d > 0))) {
    console.error(
      "usage: deno task bench calibrate --model M --node-id ID [--depths 512,2048,8192] [--threads N] [--out FILE]",
    );
    Deno.exit(2);
  }
  const node = await calibrate({
    modelPath: values.model,
    nodeId: values["node-id"],
    depths,
    threads: values.threads ? Number(values.threads) : undefined,
  });
  await writeCalibration(values.out, node);
  for (const p of node.prefill) {
    console.log(`prefill at depth ~${p.contextTokens}: ${p.tokensPerS.toFixed(0)} tokens/s`);
  }
  for (const p of node.decode) {
    console.log(`decode at depth ~${p.contextTokens}: ${p.tokensPerS.toFixed(1)} tokens/s`);
  }
  console.log(`calibration: ${values.out} (node ${node.nodeId})`);
}
