/**
 * Refusals that need no running worker: admission full (503 with Retry-After), a worker that
 * cannot be reached (500 server_error, one line), authentication, body validation and the
 * body bound (a chunked body refused as it passes it). The app runs in this process on the
 * real tiny model's vocabulary; the "worker" addresses are closed loopback ports this test
 * picked.
 */
import assert from "node:assert/strict";
import { Node } from "../serve/node.ts";
import { testModel } from "../testing/models.ts";
import { ApiKeys } from "./keys.ts";
import { PeerSet } from "./peers.ts";
import { startApiServer } from "./server.ts";
import { REQUEST_BODY_BYTES_MAX } from "./app.ts";

const KEY = "refusals-test-key-0123456789";

/** A loopback UDP port nothing listens on (bound, then closed). */
function closedPort(): number {
  const socket = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
  const port = (socket.addr as Deno.NetAddr).port;
  socket.close();
  return port;
}

Deno.test("the API refuses in OpenAI's shape: 503 when full, 500 for a lost worker, 401, 400", async () => {
  const dir = await Deno.makeTempDir();
  const node = await Node.open(`${dir}/coordinator`);
  const modelPath = await testModel("hybrid");
  const server = await startApiServer({
    hostname: "127.0.0.1",
    port: 0,
    node,
    modelPath,
    nCtx: 256,
    peers: new PeerSet([{
      peer: { nodeId: "aaaaaaaaaaaaaaaa", host: "127.0.0.1", port: closedPort() },
      role: "decode",
    }]),
    placement: "colocated",
    admission: { requestsInFlightMax: 1, queueDepthMax: 0, retryAfterS: 3 },
    keys: ApiKeys.parse(JSON.stringify({ [KEY]: "t" })),
    workerIdleTimeoutMs: 5_000,
  });
  const post = (body: unknown, key: string | null = KEY) =>
    fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(key ? { authorization: `Bearer ${key}` } : {}),
      },
      body: JSON.stringify(body),
    });
  const model = server.model.id;
  try {
    // 401 without a key; /health and /metrics need none.
    const anon = await post({ model, prompt: "x" }, null);
    assert.equal(anon.status, 401);
    assert.equal((await anon.json()).error.type, "authentication_error");
    assert.equal((await fetch(`${server.url}/health`).then((r) => r.json())).status, "ok");

    // 400s name the field.
    const badStop = await post({ model, prompt: "x", stop: ["a", "b", "c", "d", "e"] });
    assert.equal(badStop.status, 400);
    const err = (await badStop.json()).error;
    assert.equal(err.param, "stop");
    assert.match(err.message, /^Invalid field "stop"/);
    const noPrompt = await post({ model });
    assert.equal((await noPrompt.json()).error.param, "prompt");

    // A chunked body (no content-length) past the body bound: refused as it arrives.
    let sentBytes = 0;
    const endless = new ReadableStream<Uint8Array>({
      pull(controller) {
        const piece = new Uint8Array(1 << 20).fill(0x20);
        sentBytes += piece.byteLength;
        if (sentBytes > 4 * REQUEST_BODY_BYTES_MAX) controller.close();
        else controller.enqueue(piece);
      },
    });
    const huge = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: endless,
    });
    assert.equal(huge.status, 413);
    assert.equal((await huge.json()).error.code, "request_too_large");
    assert.ok(sentBytes < 2 * REQUEST_BODY_BYTES_MAX, `the client sent ${sentBytes} bytes`);

    // The context check counts tokens with the model's vocabulary, before admission.
    const long = await post({ model, prompt: "word ".repeat(300), max_tokens: 1 });
    assert.equal(long.status, 400);
    const ctx = (await long.json()).error;
    assert.equal(ctx.type, "exceed_context_size_error");
    assert.equal(ctx.n_ctx, 256);
    assert.ok(ctx.n_prompt_tokens > 256);

    // 503 with Retry-After while the only slot is held and the queue holds none.
    const held = await server.service.options.admission.acquire();
    const busy = await post({ model, prompt: "x", max_tokens: 1 });
    assert.equal(busy.status, 503);
    assert.equal(busy.headers.get("retry-after"), "3");
    assert.equal((await busy.json()).error.type, "unavailable_error");
    held.release();

    // 500 when the worker cannot be reached: one line, and the slot is free again.
    const lost = await post({ model, prompt: "x", max_tokens: 1 });
    assert.equal(lost.status, 500);
    const e500 = (await lost.json()).error;
    assert.equal(e500.type, "server_error");
    assert.doesNotMatch(e500.message, /\n/);
    assert.equal(server.service.options.admission.running, 0);
    const metrics = await fetch(`${server.url}/metrics`).then((r) => r.text());
    assert.match(metrics, /skippy:request_failures_total\{reason="[^"]+"\} 1/);
    assert.match(
      metrics,
      /skippy:http_responses_total\{route="\/v1\/completions",status="503"\} 1/,
    );
    assert.match(metrics, /skippy:num_requests_running 0/);
    assert.match(metrics, /skippy:worker_up\{node_id="aaaaaaaaaaaaaaaa",role="decode"\} 0/);
  } finally {
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
});
