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
import { chatTemplateModel, testModel } from "../testing/models.ts";
import { spansWithin } from "../serve/prefix_cache.ts";
import { ApiKeys } from "./keys.ts";
import { startClusterApi } from "./_test_server.ts";
import { renderChat } from "./chat.ts";
import { userTurnEnds } from "./chat_turns.ts";

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

// The dense test model has a plain chat template; the ChatML model's template writes markers that
// are control tokens (serve/prompt_tokens.ts), so the worker must find the turn's end with the
// same span-aware tokenization as the prompt's. Blocks of 256 tokens are longer than these
// prompts, so no block checkpoint exists: a hit can only come from the user-turn end the API
// passed with the first request.
for (
  const [name, model] of [
    ["dense template", () => testModel("dense")],
    ["ChatML control-token markers", chatTemplateModel],
  ] as const
) {
  Deno.test(`prefix cache: a chat's follow-up turn hits at the end of the previous user turn (${name})`, async () => {
    await followUpTurnHits(await model());
  });
}

async function followUpTurnHits(modelPath: string): Promise<void> {
  const cluster = await startLocalCluster({
    args: ["--model", modelPath],
    prefillArgs: ["--prefix-cache-bytes-max", String(64 << 20), "--prefix-block-tokens", "256"],
  });
  const server = await startClusterApi(cluster, modelPath, {
    placement: "disaggregated",
    keys: ApiKeys.parse(JSON.stringify({ [KEY_A]: "tenant-a", [KEY_B]: "tenant-b" })),
  });
  const chat = (
    apiKey: string,
    messages: { role: "system" | "user" | "assistant"; content: string }[],
  ) =>
    new OpenAI({ baseURL: `${server.url}/v1`, apiKey, maxRetries: 0 }).chat.completions.create({
      model: server.model.id,
      messages,
      max_tokens: 8,
      temperature: 0,
    });
  const cached = (r: { usage?: unknown }) =>
    (r.usage as { prompt_tokens_details?: { cached_tokens?: number } })
      .prompt_tokens_details?.cached_tokens;
  try {
    const turn1 = [
      { role: "system" as const, content: "You answer in words. ".repeat(4) },
      { role: "user" as const, content: "the quick brown fox jumps over the lazy dog ".repeat(3) },
    ];
    const first = await chat(KEY_A, turn1);
    assert.equal(cached(first), 0);
    const turn2 = [
      ...turn1,
      { role: "assistant" as const, content: first.choices[0].message.content ?? "" },
      { role: "user" as const, content: "and then what happened next" },
    ];
    const second = await chat(KEY_A, turn2);
    // Restored: exactly the first conversation up to the end of its user message.
    const { prompt, specialSpans } = renderChat(server.model, turn1);
    const head = prompt.slice(0, userTurnEnds(server.model, turn1, prompt)[0]);
    const headBytes = new TextEncoder().encode(head).length;
    assert.equal(
      cached(second),
      server.model.countTokens(head, spansWithin(specialSpans ?? [], headBytes)),
    );
    assert.ok(cached(second)! > 0 && cached(second)! < second.usage!.prompt_tokens);
    // Another tenant's identical follow-up computes it cold: the same greedy text.
    const cold = await chat(KEY_B, turn2);
    assert.equal(cached(cold), 0);
    assert.equal(second.choices[0].message.content, cold.choices[0].message.content);
  } finally {
    await server.close();
    await cluster.stop();
  }
}
