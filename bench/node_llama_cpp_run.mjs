// The node-llama-cpp side of `deno task bench --only batch` (bench/node_llama_cpp.ts copies
// this file next to a scratch install of node-llama-cpp and runs it with `node`): the same
// model and the same requests (token ids), decoded greedily in waves of `concurrency`
// sequences of one context (node-llama-cpp's own batching), decode phase only: each wave's
// prompts (but their last token) are evaluated first, then the clock runs while every
// sequence evaluates its last prompt token and generates `decodeTokens` tokens. Prints one
// JSON object on stdout: per concurrency, decode tokens/s summed over streams (wall clock and
// per CPU-second of this process) and each request's tokens. Never asserts.
//
//     node node_llama_cpp_run.mjs <input.json>
//     input: {modelPath, prompts: number[][], concurrency: number[], decodeTokens, threads,
//             contextSize, repeats}
import { readFileSync } from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

// Prebuilt binaries only (the same @node-llama-cpp/<platform> build this project loads); CPU.
const llama = await getLlama({
  build: "never",
  gpu: false,
  logLevel: LlamaLogLevel.error,
  maxThreads: input.threads,
});
const model = await llama.loadModel({ modelPath: input.modelPath, gpuLayers: 0 });

async function decodeWave(all, prompts) {
  const sequences = all.slice(0, prompts.length);
  await Promise.all(sequences.map((s) => s.clearHistory()));
  await Promise.all(
    sequences.map((s, i) => s.evaluateWithoutGeneratingNewTokens(prompts[i].slice(0, -1))),
  );
  const t0 = performance.now();
  const cpu0 = cpuSeconds();
  const tokens = await Promise.all(sequences.map(async (s, i) => {
    const out = [];
    const last = prompts[i].slice(-1);
    for await (const token of s.evaluate(last, { temperature: 0 })) {
      out.push(token);
      if (out.length >= input.decodeTokens) break;
    }
    return out;
  }));
  const ms = performance.now() - t0;
  const cpuS = cpuSeconds() - cpu0;
  return { tokens, ms, cpuS };
}

const rows = [];
for (const c of input.concurrency) {
  const context = await model.createContext({
    sequences: c,
    contextSize: input.contextSize,
    batchSize: 512,
    threads: input.threads,
  });
  // Each sequence is reused by every wave (its history cleared first).
  const sequences = Array.from({ length: c }, () => context.getSequence());
  const rates = [];
  const cpuRates = [];
  let tokens = [];
  for (let r = 0; r < input.repeats; r++) {
    let count = 0;
    let ms = 0;
    let cpuS = 0;
    tokens = [];
    for (let w = 0; w < input.prompts.length; w += c) {
      const wave = await decodeWave(sequences, input.prompts.slice(w, w + c));
      count += wave.tokens.reduce((a, t) => a + t.length, 0);
      ms += wave.ms;
      cpuS += wave.cpuS;
      tokens.push(...wave.tokens);
    }
    rates.push(count / (ms / 1000));
    cpuRates.push(count / cpuS);
  }
  await context.dispose();
  rows.push({
    concurrency: c,
    tokensPerSec: median(rates),
    tokensPerCpuSec: median(cpuRates),
    tokens,
  });
}
await model.dispose();
process.stdout.write(JSON.stringify({ rows }) + "\n");
