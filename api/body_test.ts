import assert from "node:assert/strict";
import { ApiError } from "./errors.ts";
import { readJsonBody } from "./body.ts";

/** A chunked body (no content-length) of `chunks` pieces of `chunkBytes` bytes of JSON text. */
function chunkedRequest(
  chunks: number,
  chunkBytes: number,
): { request: Request; pulled: () => number } {
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (sent === chunks) return controller.close();
      controller.enqueue(
        new TextEncoder().encode(
          sent === 0
            ? "[" + " ".repeat(chunkBytes - 1)
            : sent === chunks - 1
            ? " ".repeat(chunkBytes - 1) + "]"
            : " ".repeat(chunkBytes),
        ),
      );
      sent++;
    },
  });
  const request = new Request("http://127.0.0.1/v1/completions", { method: "POST", body });
  assert.equal(request.headers.get("content-length"), null);
  return { request, pulled: () => sent };
}

Deno.test("readJsonBody reads a chunked body within its bound", async () => {
  const { request } = chunkedRequest(4, 1024);
  assert.deepEqual(await readJsonBody(request, 4096), []);
});

Deno.test("readJsonBody refuses a chunked body the moment it passes the bound, without reading the rest", async () => {
  const { request, pulled } = chunkedRequest(1000, 1024);
  await assert.rejects(readJsonBody(request, 4096), (e: unknown) => {
    assert.ok(e instanceof ApiError);
    assert.equal(e.status, 413);
    assert.match(e.message, /over 4096 bytes.*shorter prompt/);
    return true;
  });
  assert.ok(pulled() <= 6, `read ${pulled()} chunks of 1000`);
});

Deno.test("readJsonBody refuses a declared length over the bound before reading, and names bad JSON", async () => {
  const big = new Request("http://127.0.0.1/", {
    method: "POST",
    body: "x",
    headers: { "content-length": "5000" },
  });
  await assert.rejects(
    readJsonBody(big, 4096),
    (e: unknown) => e instanceof ApiError && e.status === 413 && /over 4096 bytes/.test(e.message),
  );
  const bad = new Request("http://127.0.0.1/", { method: "POST", body: "{nope" });
  await assert.rejects(
    readJsonBody(bad, 4096),
    (e: unknown) => e instanceof ApiError && e.status === 400,
  );
});
