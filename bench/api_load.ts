/**
 * Load check of the HTTP API: starts `coordinate --local` (default tiny model), sends
 * `--clients` concurrent requests with mixed prompt lengths through the openai client, and
 * reports how each ended (completed, 503, other error), latencies, and the resident memory of
 * the coordinator and its workers (Linux /proc) before and after. Numbers, never asserted.
 *
 *     deno run -A --unstable-net bench/api_load.ts --clients 16 --max-tokens 32
 */
import OpenAI from "openai";
import { benchArgs, orExit, wholeNumber } from "./cli_args.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const values = benchArgs("api_load.ts", {
  clients: { default: "16" },
  "max-tokens": { default: "32" },
  "prompt-tokens-max": { default: "7000" },
  placement: { default: "disaggregated" },
  "requests-in-flight-max": { default: "2" },
  // The openai client's own default is 10 minutes; a loaded machine queues longer than that.
  "client-timeout-ms": { default: "1800000" },
});
const clients = orExit(() => wholeNumber("--clients", values.clients, 1, 1000));
const maxTokens = orExit(() => wholeNumber("--max-tokens", values["max-tokens"], 1, 1 << 16));
const promptMax = orExit(() =>
  wholeNumber("--prompt-tokens-max", values["prompt-tokens-max"], 1, 1 << 20)
);

function rssKiB(pid: number): number {
  try {
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  } catch {
    return 0;
  }
}

function descendants(pid: number): number[] {
  const out: number[] = [];
  try {
    for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
      const kids = Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/children`).trim();
      for (const k of kids ? kids.split(" ").map(Number) : []) out.push(k, ...descendants(k));
    }
  } catch { /* gone */ }
  return out;
}

const memory = (pid: number) => ({
  coordinatorMiB: Math.round(rssKiB(pid) / 1024),
  workersMiB: descendants(pid).map((p) => Math.round(rssKiB(p) / 1024)).filter((m) => m > 50),
});

const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    "--unstable-net",
    MAIN,
    "coordinate",
    "--local",
    "--listen",
    "127.0.0.1:0",
    "--placement",
    String(values.placement),
    "--requests-in-flight-max",
    String(values["requests-in-flight-max"]),
    "--queue-wait-ms",
    "600000",
  ],
  stdout: "piped",
  stderr: "inherit",
}).spawn();
const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
let line = "";
while (!line.includes("\n")) line += (await reader.read()).value ?? "";
const ready = JSON.parse(line.split("\n")[0]);
const client = new OpenAI({
  baseURL: `${ready.url}/v1`,
  apiKey: "none",
  maxRetries: 0,
  timeout: Number(values["client-timeout-ms"]),
});
const before = memory(child.pid);
const words = "the quick brown fox jumps over the lazy dog and ";
const results = await Promise.all(Array.from({ length: clients }, async (_, i) => {
  // Prompt lengths spread from 100 tokens to promptMax (the test vocabulary spends about 2.1
  // tokens per word of this text; the usage reports the exact count).
  const tokens = Math.round(100 + (promptMax - 100) * (i / Math.max(1, clients - 1)));
  const nWords = Math.round(tokens / 2.1);
  const prompt = words.repeat(Math.ceil(nWords / 10)).split(" ").slice(0, nWords).join(" ");
  const t0 = performance.now();
  try {
    const r = await client.completions.create({
      model: ready.model,
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
    });
    return {
      outcome: "completed",
      promptTokens: r.usage?.prompt_tokens,
      completionTokens: r.usage?.completion_tokens,
      ms: Math.round(performance.now() - t0),
    };
  } catch (error) {
    const status = (error as { status?: number }).status;
    return { outcome: status === 503 ? "503" : `error ${status}: ${(error as Error).message}` };
  }
}));
const after = memory(child.pid);
const metrics = await fetch(`${ready.url}/metrics`).then((r) => r.text());
child.kill("SIGTERM");
await child.status;
const count = (o: string) => results.filter((r) => r.outcome === o).length;
console.log(JSON.stringify(
  {
    clients,
    maxTokens,
    completed: count("completed"),
    refused503: count("503"),
    other: results.filter((r) => r.outcome !== "completed" && r.outcome !== "503"),
    latencyMs: results.map((r) => r.ms ?? null),
    promptTokens: results.map((r) => r.promptTokens ?? null),
    rssBefore: before,
    rssAfter: after,
    failuresMetric: metrics.split("\n").filter((l) =>
      l.startsWith("skippy:request_failures_total")
    ),
    running: metrics.split("\n").find((l) => l.startsWith("skippy:num_requests_running ")),
  },
  null,
  2,
));
