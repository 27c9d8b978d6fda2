/**
 * Issue #9: log probabilities in OpenAI's shapes, through the official `openai` client over a
 * disaggregated handoff (the first token's from the prefill worker, the rest from the decode
 * worker), checked against log-softmax of the logits of the same greedy generation run here
 * (tiny hybrid model, real llama.cpp). Batched decode is not bitwise equal to decoding alone,
 * so values are compared within a tolerance; the chosen tokens are compared exactly.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { type TokenLogprob, tokenLogprob } from "../core/logprobs.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { testModel } from "../testing/models.ts";
import { ApiKeys } from "./keys.ts";
import { startClusterApi } from "./_test_server.ts";

const KEY = "key-for-tenant-a-0123456789";
const PROMPT = "the quick brown fox jumps over the lazy dog and ";
const N = 6;
const K = 3;
/** Logits of a batched step differ from decoding alone in the last bits (docs/BATCHING.md). */
const TOLERANCE = 1e-3;

async function localLogprobs(modelPath: string): Promise<TokenLogprob[]> {
  using engine = await Engine.open({ ...RUNTIME_DEFAULTS, modelPath });
  const logits = await engine.prefill(engine.model.vocab.tokenize(PROMPT));
  const lps: TokenLogprob[] = [];
  const greedy = { temperature: 0, topK: 40, topP: 0.95 };
  for await (const s of engine.generate(logits, N, greedy, { seed: 1, draws: 0 })) {
    lps.push(tokenLogprob(s.logits, s.token, K));
  }
  return lps;
}

Deno.test("logprobs: completions and chat in OpenAI's shape, equal to the logits' log-softmax", async (t) => {
  const modelPath = await testModel("hybrid");
  const cluster = await startLocalCluster({ args: ["--model", modelPath] });
  const server = await startClusterApi(cluster, modelPath, {
    placement: "disaggregated",
    keys: ApiKeys.parse(JSON.stringify({ [KEY]: "tenant-a" })),
  });
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const model = server.model.id;
  try {
    const local = await localLogprobs(modelPath);

    await t.step("completions: logprobs k", async () => {
      const r = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: N,
        temperature: 0,
        logprobs: K,
      });
      const skippy = (r as unknown as { skippy: { placement: string } }).skippy;
      assert.equal(skippy.placement, "disaggregated");
      const lp = r.choices[0].logprobs!;
      assert.equal(lp.tokens!.length, r.usage!.completion_tokens);
      assert.ok(lp.tokens!.length <= local.length);
      assert.equal(lp.tokens!.join(""), r.choices[0].text);
      assert.deepEqual(lp.text_offset![0], 0);
      lp.token_logprobs!.forEach((v, i) => {
        assert.ok(Math.abs(v - local[i].logprob) < TOLERANCE, `token ${i}: ${v}`);
        const top = Object.values(lp.top_logprobs![i]);
        assert.equal(top.length, K);
        // Greedy: the chosen token is the most likely one.
        assert.ok(Math.abs(Math.max(...top) - v) < 1e-9);
        local[i].top.forEach(([, want], j) => assert.ok(Math.abs(top[j] - want) < TOLERANCE));
      });
    });

    await t.step("chat: logprobs true with top_logprobs", async () => {
      const r = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "hello there" }],
        max_tokens: N,
        temperature: 0,
        logprobs: true,
        top_logprobs: 2,
      });
      const content = r.choices[0].logprobs!.content!;
      assert.equal(content.length, r.usage!.completion_tokens);
      const text = new TextDecoder().decode(new Uint8Array(content.flatMap((c) => c.bytes!)));
      assert.equal(text, r.choices[0].message.content);
      for (const c of content) {
        assert.ok(c.logprob <= 0);
        assert.equal(c.top_logprobs.length, 2);
        assert.ok(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob);
        assert.equal(c.top_logprobs[0].token, c.token); // greedy
      }
    });

    await t.step("refusals name the field and why", async () => {
      const stream = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: 2,
        logprobs: 1,
        stream: true,
      }).catch((e) => e);
      assert.ok(stream instanceof OpenAI.BadRequestError, String(stream));
      assert.match(stream.message, /logprobs.*non-streaming/);
      const top = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2,
        top_logprobs: 2,
      }).catch((e) => e);
      assert.ok(top instanceof OpenAI.BadRequestError, String(top));
      assert.match(top.message, /top_logprobs.*"logprobs": true/);
    });
  } finally {
    await server.close();
    await cluster.stop();
  }
});
