/**
 * `coordinate --local` as a user runs it (a child process that starts its own two workers),
 * on the dense test model, which has a chat template: the openai client's chat completion
 * equals local `generate` of the template-rendered prompt, token for token (greedy), over a
 * disaggregated handoff; SIGTERM stops it and its workers.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { testModel } from "../testing/models.ts";
import { runCliProcess } from "../testing/cli.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const KEY = "coordinate-test-key-0123456789";

async function firstJsonLine(stream: ReadableStream<Uint8Array>): Promise<Record<string, unknown>> {
  let text = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    text += chunk;
    const nl = text.indexOf("\n");
    if (nl >= 0) return JSON.parse(text.slice(0, nl));
  }
  throw new Error(`coordinate exited before its ready line: ${text}`);
}

Deno.test("coordinate --local serves chat with the model's template, equal to local generate (the decoder speculating)", async () => {
  const model = await testModel("dense");
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/keys.json`, JSON.stringify({ [KEY]: "team-a" }));
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--unstable-net",
      MAIN,
      "coordinate",
      "--local",
      "--model",
      model,
      "--listen",
      "127.0.0.1:0",
      "--api-keys",
      `${dir}/keys.json`,
      "--placement",
      "disaggregated",
      "--telemetry",
      `${dir}/telemetry.jsonl`,
      // The decode worker's default: the API's request speculates, and its text is unchanged.
      "--speculation",
      "suffix",
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  try {
    const ready = await firstJsonLine(child.stdout);
    assert.equal(ready.ready, true);
    assert.equal(ready.authenticated, true);
    const client = new OpenAI({ baseURL: `${ready.url}/v1`, apiKey: KEY, maxRetries: 0 });
    const chat = await client.chat.completions.create({
      model: String(ready.model),
      messages: [{ role: "user", content: "hello there" }],
      max_tokens: 10,
      temperature: 0,
    });
    // DENSE_CHAT_TEMPLATE's rendering (BOS is added by the tokenizer, not as text).
    const rendered = "<|user|>\nhello there\n<|assistant|>\n";
    const local = await runCliProcess([
      "generate",
      "--model",
      model,
      "--prompt",
      rendered,
      "-n",
      "10",
      "--json",
    ]);
    assert.equal(local.code, 0, local.stderr);
    const g = JSON.parse(local.stdout);
    assert.equal(chat.choices[0].message.content, g.text);
    assert.equal(chat.usage?.prompt_tokens, g.promptTokens);
    assert.equal(chat.usage?.completion_tokens, g.tokens.length);
    const skippy = (chat as unknown as { skippy: Record<string, unknown> }).skippy;
    assert.equal(skippy.placement, "disaggregated");
    assert.equal(skippy.fallback_reason, null);
    assert.equal(skippy.chat_format, "model-template");
  } finally {
    child.kill("SIGTERM");
  }
  const status = await child.status;
  const log = await stderr;
  assert.equal(status.code, 0, log);
  assert.match(log, /coordinate: stopping \(SIGTERM\)/);
  assert.doesNotMatch(log, new RegExp(KEY), "the key is never logged");
  const lines = (await Deno.readTextFile(`${dir}/telemetry.jsonl`)).trim().split("\n");
  assert.equal(lines.length, 1);
  const record = JSON.parse(lines[0]);
  assert.equal(record.tenantId, "team-a");
  assert.equal(record.placement, "disaggregated");
  assert.ok(record.handoff.totalBytes > 0);
  assert.equal(record.handoff.speculation?.mode, "suffix");
  assert.ok(record.handoff.rttMs > 0, "the prefill -> decode reservation round trip");
  assert.ok(record.handoff.speculation.rounds > 0, "the decoder ran speculative rounds");
  assert.doesNotMatch(lines[0], /hello there/, "no content in telemetry");
  await Deno.remove(dir, { recursive: true });
});

Deno.test("coordinate --peers serves running workers and re-reads the peers file", async () => {
  const model = await testModel("hybrid");
  const cluster = await startLocalCluster({ args: ["--model", model] });
  const peersFile = `${cluster.dir}/peers.json`;
  const entry = (p: { nodeId: string; host: string; port: number }, role: string) => ({
    address: `${p.host}:${p.port}`,
    nodeId: p.nodeId,
    role,
  });
  await Deno.writeTextFile(
    peersFile,
    JSON.stringify({
      workers: [entry(cluster.prefill.peer, "prefill"), entry(cluster.decode.peer, "decode")],
    }),
  );
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--unstable-net",
      MAIN,
      "coordinate",
      "--peers",
      peersFile,
      "--state-dir",
      cluster.client.stateDir,
      "--model",
      model,
      "--listen",
      "127.0.0.1:0",
      "--peers-poll-ms",
      "100",
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  try {
    const ready = await firstJsonLine(child.stdout);
    assert.equal(ready.authenticated, false);
    assert.equal(ready.placement, "auto");
    const client = new OpenAI({ baseURL: `${ready.url}/v1`, apiKey: "none", maxRetries: 0 });
    const r = await client.completions.create({
      model: String(ready.model),
      prompt: "hello",
      max_tokens: 4,
      temperature: 0,
    });
    // auto: a short prompt runs colocated, and the planner's reason says why.
    const skippy = (r as unknown as { skippy: Record<string, unknown> }).skippy;
    assert.equal(skippy.placement, "colocated");
    assert.match(String(skippy.placement_reason), /under promptTokensMin 2048/);
    assert.equal(r.usage?.completion_tokens, 4);
    // Dropping the prefill worker from the file is picked up by the poll.
    await Deno.writeTextFile(
      peersFile,
      JSON.stringify({ workers: [entry(cluster.decode.peer, "decode")] }),
    );
    await Deno.utime(peersFile, new Date(), new Date(Date.now() + 5_000));
    for (;;) {
      const health = await fetch(`${ready.url}/health`).then((h) => h.json());
      if (health.workers === 1) break;
      await new Promise((res) => setTimeout(res, 50));
    }
  } finally {
    child.kill("SIGINT");
    const status = await child.status;
    const log = await stderr;
    await cluster.stop();
    assert.equal(status.code, 0, log);
    assert.match(log, /UNAUTHENTICATED/);
    assert.match(log, /peers file re-read: 1 workers/);
  }
});
