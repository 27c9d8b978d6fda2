/**
 * The prefix cache as an OpenAI client sees it (issue #12): `serve` child processes with
 * `--prefix-cache-bytes-max` on the prefill worker, the API in this process, the official
 * `openai` client. A repeated prompt of the same tenant reports
 * `usage.prompt_tokens_details.cached_tokens` (a block-aligned share of the prompt) with the same
 * greedy text as the first; another tenant's identical prompt reports 0.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { testModel } from "../testing/models.ts";
import { ApiKeys } from "./keys.ts";
import { startClusterApi } from "./_test_server.ts";

const KEY_A = "key-for-tenant-a-0123456789";
const KEY_B = "key-for-tenant-b-0123456789";
const BLOCK = 16;

Deno.test("prefix cache: cached_tokens in the OpenAI usage, per tenant, same text", async () => {
  const modelPath = await testModel("hybrid");
  const cluster = await startLocalCluster({
    args: ["--model", modelPath],
    prefillArgs: [
      "--prefix-cache-bytes-max",
      String(64 << 20),
      "--prefix-block-tokens",
      String(BLOCK),
    ],
  });
  const server = await startClusterApi(cluster, modelPath, {
    placement: "disaggregated",
    keys: ApiKeys.parse(JSON.stringify({ [KEY_A]: "tenant-a", [KEY_B]: "tenant-b" })),
  });
  const clientFor = (apiKey: string) =>
    new OpenAI({ baseURL: `${server.url}/v1`, apiKey, maxRetries: 0 });
  const prompt = "the quick brown fox jumps over the lazy dog and ".repeat(6);
  const complete = (apiKey: string) =>
    clientFor(apiKey).completions.create({
      model: server.model.id,
      prompt,
      max_tokens: 8,
      temperature: 0,
    });
  try {
    const first = await complete(KEY_A);
    const cached = (r: typeof first) =>
      (r.usage as { prompt_tokens_details?: { cached_tokens?: number } })
        .prompt_tokens_details?.cached_tokens;
    assert.equal(cached(first), 0);
    const second = await complete(KEY_A);
    const n = second.usage!.prompt_tokens;
    // The deepest checkpoint before the prompt's end: the last block boundary under n.
    assert.equal(cached(second), Math.floor((n - 1) / BLOCK) * BLOCK);
    assert.ok(cached(second)! > 0);
    assert.equal(second.choices[0].text, first.choices[0].text);
    const other = await complete(KEY_B);
    assert.equal(cached(other), 0);
    assert.equal(other.choices[0].text, first.choices[0].text);
    // /metrics counts the restored tokens (only the second request had any).
    const metrics = await fetch(`${server.url}/metrics`).then((r) => r.text());
    const line = metrics.split("\n").find((l) =>
      l.startsWith("skippy:prompt_tokens_cached_total ")
    );
    assert.equal(Number(line?.split(" ")[1]), cached(second));
  } finally {
    await server.close();
    await cluster.stop();
  }
});
