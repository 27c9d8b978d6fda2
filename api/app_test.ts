/**
 * The official `openai` client, unchanged, against the API in this process over one shared
 * local cluster (a prefill and a decode worker as child processes, real llama.cpp, the tiny
 * hybrid model, which has no chat template: the plain fallback). Greedy text is compared with
 * local `generate`, token counts with its token list, log probabilities with log-softmax of
 * local generation's logits.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { queryStats } from "../serve/stats.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { type TokenLogprob, tokenLogprob } from "../core/logprobs.ts";
import { HANG_MS } from "../testing/bounds.ts";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";
import { plainChat } from "./chat.ts";
import { ApiKeys } from "./keys.ts";
import { PeerSet } from "./peers.ts";
import { startApiServer } from "./server.ts";
import { startClusterApi } from "./_test_server.ts";

const KEY_A = "key-for-tenant-a-0123456789";
const KEY_B = "key-for-tenant-b-0123456789";
const PROMPT = "the quick brown fox jumps over the lazy dog and ";
const N = 12;

async function localGenerate(model: string, prompt: string, n: number) {
  const r = await runCliProcess([
    "generate",
    "--model",
    model,
    "--prompt",
    prompt,
    "-n",
    String(n),
    "--json",
  ]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout) as { text: string; tokens: number[]; promptTokens: number };
}

/** Batched decode's logits differ from decoding alone in the last bits (docs/BATCHING.md). */
const LOGPROB_TOLERANCE = 1e-3;

/** Log-softmax of the logits of local greedy generation, per token, with `k` alternatives. */
async function localLogprobs(modelPath: string, prompt: string, n: number, k: number) {
  using engine = await Engine.open({ ...RUNTIME_DEFAULTS, modelPath });
  const logits = await engine.prefill(engine.model.vocab.tokenize(prompt));
  const out: TokenLogprob[] = [];
  const greedy = { temperature: 0, topK: 40, topP: 0.95 };
  for await (const s of engine.generate(logits, n, greedy, { seed: 1, draws: 0 })) {
    out.push(tokenLogprob(s.logits, s.token, k));
  }
  return out;
}

/** Polls until `check` holds (a hang bound only: nothing here is timed). */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  const t0 = Date.now();
  while (!(await check())) {
    if (Date.now() - t0 > HANG_MS) throw new Error(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function metricValue(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  assert.ok(line, `metric ${name} missing`);
  return Number(line.split(" ")[1]);
}

Deno.test("the openai client gets local generate's text from the API over a disaggregated handoff", async (t) => {
  const modelPath = await testModel("hybrid");
  const cluster = await startLocalCluster({ args: ["--model", modelPath] });
  const server = await startClusterApi(cluster, modelPath, {
    placement: "disaggregated",
    keys: ApiKeys.parse(JSON.stringify({ [KEY_A]: "tenant-a", [KEY_B]: "tenant-b" })),
  });
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY_A, maxRetries: 0 });
  const model = server.model.id;
  try {
    const local = await localGenerate(modelPath, PROMPT, N);

    await t.step("non-streaming completion equals local generate, with usage", async () => {
      const r = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: N,
        temperature: 0,
      });
      assert.equal(r.choices[0].text, local.text);
      assert.equal(r.usage?.prompt_tokens, local.promptTokens);
      assert.equal(r.usage?.completion_tokens, local.tokens.length);
      assert.equal(r.choices[0].finish_reason, local.tokens.length === N ? "length" : "stop");
      assert.equal(
        (r as unknown as { skippy: { placement: string } }).skippy.placement,
        "disaggregated",
      );
    });

    await t.step("streaming completion equals local generate; usage chunk last", async () => {
      const stream = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: N,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let usage: OpenAI.CompletionUsage | null = null;
      let finish: string | null = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.text ?? "";
        finish = chunk.choices[0]?.finish_reason ?? finish;
        if (chunk.usage) usage = chunk.usage;
      }
      assert.equal(text, local.text);
      assert.ok(finish);
      assert.equal(usage?.completion_tokens, local.tokens.length);
      assert.equal(usage?.prompt_tokens, local.promptTokens);
    });

    await t.step(
      "chat without a model template uses the plain fallback, streamed or not",
      async () => {
        const messages = [{ role: "user" as const, content: "hello there" }];
        const chat = await client.chat.completions.create({
          model,
          messages,
          max_tokens: 8,
          temperature: 0,
        });
        const same = await client.completions.create({
          model,
          prompt: plainChat(messages),
          max_tokens: 8,
          temperature: 0,
        });
        assert.equal(chat.choices[0].message.role, "assistant");
        const skippy = (chat as unknown as { skippy: Record<string, unknown> }).skippy;
        assert.equal(skippy.chat_format, "plain-fallback");
        assert.equal(chat.choices[0].message.content, same.choices[0].text);
        const stream = await client.chat.completions.create({
          model,
          messages,
          max_tokens: 8,
          temperature: 0,
          stream: true,
        });
        let content = "";
        for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? "";
        assert.equal(content, same.choices[0].text);
      },
    );

    await t.step("a stop sequence cuts the text and ends the request on the workers", async () => {
      const stop = local.text.slice(Math.floor(local.text.length / 2)).slice(0, 3);
      const cut = local.text.indexOf(stop);
      assert.ok(stop.length > 0 && cut > 0);
      const r = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: 2000,
        temperature: 0,
        stop,
      });
      assert.equal(r.choices[0].text, local.text.slice(0, cut));
      assert.equal(r.choices[0].finish_reason, "stop");
      // Cancelled once the stop matched: at most one more token batch (16) reached us.
      assert.ok(r.usage!.completion_tokens <= N + 16, `${r.usage!.completion_tokens} tokens`);
    });

    await t.step("bad requests get OpenAI-shaped errors", async () => {
      const raw = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${KEY_A}`, "content-type": "application/json" },
        body: "{not json",
      });
      assert.equal(raw.status, 400);
      const body = await raw.json();
      assert.equal(body.error.type, "invalid_request_error");
      assert.equal(body.error.code, "invalid_json");
      await assert.rejects(
        client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 }),
        (e: unknown) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
      );
      await assert.rejects(
        client.completions.create({ model, prompt: PROMPT, max_tokens: RUNTIME_DEFAULTS.nCtx }),
        (e: unknown) => {
          assert.ok(e instanceof OpenAI.BadRequestError);
          const err = e.error as Record<string, unknown>;
          assert.equal(err.type, "exceed_context_size_error");
          assert.equal(err.n_prompt_tokens, local.promptTokens);
          assert.equal(err.n_ctx, RUNTIME_DEFAULTS.nCtx);
          return true;
        },
      );
      // A stream refused before it starts keeps its HTTP status.
      await assert.rejects(
        client.completions.create({
          model,
          prompt: PROMPT,
          max_tokens: RUNTIME_DEFAULTS.nCtx,
          stream: true,
        }),
        (e: unknown) => e instanceof OpenAI.BadRequestError && e.status === 400,
      );
      await assert.rejects(
        client.completions.create({ model, prompt: "x", temperature: 7 }),
        (e: unknown) =>
          e instanceof OpenAI.BadRequestError && e.param === "temperature" &&
          /Invalid field "temperature"/.test(e.message),
      );
      await assert.rejects(
        client.completions.create({ model, prompt: "x", n: 2 }),
        (e: unknown) => e instanceof OpenAI.BadRequestError && e.param === "n",
      );
      const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "not-a-key", maxRetries: 0 });
      await assert.rejects(
        wrong.models.list(),
        (e: unknown) => e instanceof OpenAI.AuthenticationError && e.code === "invalid_api_key",
      );
    });

    await t.step("a client that disconnects mid-stream frees its request everywhere", async () => {
      const abort = new AbortController();
      const stream = await client.completions.create(
        { model, prompt: PROMPT, max_tokens: 4000, temperature: 0, stream: true },
        { signal: abort.signal },
      );
      // Leave after the decode worker's first batch (the first text is the prefill worker's
      // FirstToken): the decoder is generating when the client goes away.
      let texts = 0;
      for await (const chunk of stream) {
        if (chunk.choices[0]?.text && ++texts === 2) break; // leaving the loop aborts it
      }
      abort.abort();
      const metrics = () => fetch(`${server.url}/metrics`).then((r) => r.text());
      await eventually(
        async () => metricValue(await metrics(), "skippy:num_requests_running") === 0,
        "the coordinator frees the request",
      );
      const decode = await cluster.client.connect(cluster.decode.peer);
      try {
        await eventually(async () => {
          const s = await queryStats(decode, 5_000);
          return s.generating === 0 && s.contextsBusy === 0 && s.committedSessions === 0;
        }, "the decode worker frees the request");
      } finally {
        await decode.close();
      }
      // The worker-side gauges (cached for statsCacheMs): both workers answer, nothing held.
      const series = (text: string, name: string) =>
        text.split("\n").filter((l) => l.startsWith(name + "{")).map((l) =>
          Number(l.split(" ")[1])
        );
      const held = ["skippy:worker_contexts_busy", "skippy:worker_generating"];
      await eventually(async () => {
        const text = await metrics();
        return held.every((name) => series(text, name).join() === "0,0");
      }, "the worker gauges read zero");
      const text = await metrics();
      assert.deepEqual(series(text, "skippy:worker_up"), [1, 1]);
      assert.deepEqual(series(text, "skippy:worker_staged_bytes"), [0, 0]);
      // The hosts' UDP receive buffer (both workers on this host), as /proc reads it.
      if (Deno.build.os === "linux") {
        const rmem = Number(Deno.readTextFileSync("/proc/sys/net/core/rmem_default").trim());
        assert.deepEqual(series(text, "skippy:worker_udp_receive_buffer_bytes"), [rmem, rmem]);
        assert.equal(series(text, "skippy:worker_udp_receive_drops").length, 2);
      }
      assert.equal(metricValue(text, "skippy:num_requests_waiting"), 0);
      assert.match(text, /skippy:request_success_total\{finished_reason="abort"\} 1/);
      assert.match(text, /skippy:time_to_first_token_seconds_count \d+/);
    });

    await t.step(
      "an unreachable prefill worker falls back to colocated, named everywhere",
      async () => {
        // The prefill worker's trusted identity at a port nothing listens on.
        const socket = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
        const deadPort = (socket.addr as Deno.NetAddr).port;
        socket.close();
        const fallback = await startApiServer({
          hostname: "127.0.0.1",
          port: 0,
          node: cluster.client,
          modelPath,
          nCtx: RUNTIME_DEFAULTS.nCtx,
          peers: new PeerSet([
            { peer: { ...cluster.prefill.peer, port: deadPort }, role: "prefill" },
            { peer: cluster.decode.peer, role: "decode" },
          ]),
          placement: "disaggregated",
          keys: null,
          workerIdleTimeoutMs: HANG_MS,
        });
        try {
          const r = await fetch(`${fallback.url}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0 }),
          });
          assert.equal(r.status, 200);
          assert.equal(r.headers.get("x-skippy-placement"), "colocated");
          assert.match(r.headers.get("x-skippy-fallback") ?? "", /prefill worker is unreachable/);
          const body = await r.json();
          assert.equal(body.choices[0].text, local.text);
          assert.equal(body.skippy.planned_placement, "disaggregated");
          const text = await fetch(`${fallback.url}/metrics`).then((m) => m.text());
          assert.match(text, /skippy:handoff_fallbacks_total\{reason="prefill-unreachable"\} 1/);
          assert.match(text, /skippy:handoff_placements_total\{placement="colocated"\} 1/);
        } finally {
          await fallback.close();
        }
      },
    );

    await t.step("logprobs: completions and chat in OpenAI's shape, from the logits", async () => {
      // The first token's log probabilities come from the prefill worker, the rest from the
      // decode worker; both equal log-softmax of local generation's logits (within batched
      // decode's last-bit differences, docs/BATCHING.md), the chosen token compared exactly.
      const K = 3;
      const lps = await localLogprobs(modelPath, PROMPT, N, K);
      const r = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: N,
        temperature: 0,
        logprobs: K,
      });
      assert.equal(
        (r as unknown as { skippy: { placement: string } }).skippy.placement,
        "disaggregated",
      );
      const lp = r.choices[0].logprobs!;
      assert.equal(lp.tokens!.length, r.usage!.completion_tokens);
      assert.equal(lp.tokens!.join(""), r.choices[0].text);
      assert.equal(lp.text_offset![0], 0);
      lp.token_logprobs!.forEach((v, i) => {
        assert.ok(Math.abs(v - lps[i].logprob) < LOGPROB_TOLERANCE, `token ${i}: ${v}`);
        // Sorted: a JS object lists integer-like keys (a token "12") first.
        const top = Object.values(lp.top_logprobs![i]).sort((a, b) => b - a);
        assert.equal(top.length, K);
        assert.ok(Math.abs(Math.max(...top) - v) < 1e-9); // greedy: the most likely token
        lps[i].top.forEach(([, want], j) =>
          assert.ok(
            Math.abs(top[j] - want) < LOGPROB_TOLERANCE,
            `alternative ${j} of token ${i}: ${top[j]} vs ${want}`,
          )
        );
      });
      const chat = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "hello there" }],
        max_tokens: N,
        temperature: 0,
        logprobs: true,
        top_logprobs: 2,
      });
      const content = chat.choices[0].logprobs!.content!;
      assert.equal(content.length, chat.usage!.completion_tokens);
      const bytes = new Uint8Array(content.flatMap((c) => c.bytes!));
      assert.equal(new TextDecoder().decode(bytes), chat.choices[0].message.content);
      for (const c of content) {
        assert.equal(c.top_logprobs.length, 2);
        assert.ok(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob);
        assert.equal(c.top_logprobs[0].token, c.token); // greedy
      }
      const streamed = await client.completions.create({
        model,
        prompt: PROMPT,
        max_tokens: 2,
        logprobs: 1,
        stream: true,
      }).catch((e) => e);
      assert.ok(streamed instanceof OpenAI.BadRequestError, String(streamed));
      assert.match(streamed.message, /logprobs.*non-streaming/);
      const top = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2,
        top_logprobs: 2,
      }).catch((e) => e);
      assert.ok(top instanceof OpenAI.BadRequestError, String(top));
      assert.match(top.message, /top_logprobs.*"logprobs": true/);
    });

    await t.step(
      "models lists the model; handoffs shows a tenant only its own records",
      async () => {
        const models = await client.models.list();
        assert.deepEqual(models.data.map((m) => m.id), [model]);
        const get = (key: string) =>
          fetch(`${server.url}/v1/handoffs?limit=50`, {
            headers: { authorization: `Bearer ${key}` },
          })
            .then((r) => r.json());
        const mine = await get(KEY_A);
        assert.ok(mine.data.length >= 5);
        assert.ok(mine.data.every((r: { tenantId: string }) => r.tenantId === "tenant-a"));
        const done = mine.data.find((r: { finishReason: string }) => r.finishReason === "length");
        assert.equal(done.placement, "disaggregated");
        assert.ok(done.handoff.totalBytes > 0);
        assert.equal(JSON.stringify(mine).includes(PROMPT.trim()), false, "no content in records");
        assert.deepEqual((await get(KEY_B)).data, []);
      },
    );
  } finally {
    await server.close();
    await cluster.stop();
  }
});
