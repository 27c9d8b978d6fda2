/**
 * The HTTP face: a Hono app (`app.fetch(Request) -> Response`, served by `Deno.serve` in
 * server.ts). Routes:
 *
 * - `POST /v1/completions`, `POST /v1/chat/completions`: streaming (SSE, `data: [DONE]`) or not.
 * - `GET /v1/models`, `GET /v1/handoffs?limit=N` (the caller's tenant's recent records).
 * - `GET /health`, `GET /metrics` (no key needed; no content in either).
 *
 * `/v1/*` needs `Authorization: Bearer <key>` when the API has keys; the key's tenant is the
 * request's tenant. Every error is OpenAI-shaped (errors.ts).
 */
import { type Context, Hono } from "hono";
import { streamSSE } from "hono/streaming";
import { z } from "zod";
import { PROMPT_BYTES_MAX } from "../serve/messages.ts";
import { type ChatFormat, renderChat } from "./chat.ts";
import { userTurnEnds } from "./chat_turns.ts";
import { readJsonBody } from "./body.ts";
import { ApiError, invalidBody, serverError } from "./errors.ts";
import { type ApiKeys, UNAUTHENTICATED_TENANT } from "./keys.ts";
import { namesModel, type ServedModel } from "./model.ts";
import { ChunkWriter, type Endpoint, wholeResponse } from "./responses.ts";
import {
  ChatBody,
  chatMessages,
  CompletionBody,
  type GenerationParams,
  toGenerationParams,
} from "./schemas.ts";
import type { ApiService } from "./service.ts";
import { HANDOFF_RECORDS_MAX } from "./telemetry.ts";

/** Largest request body, in bytes: a prompt at the request path's bound, plus 1 MiB. */
export const REQUEST_BODY_BYTES_MAX = PROMPT_BYTES_MAX + (1 << 20);

type Env = { Variables: { tenant: string } };

export function createApp(service: ApiService, keys: ApiKeys | null): Hono<Env> {
  const app = new Hono<Env>();
  // Hono runs middleware and routes in the order they are added: the middleware first.
  addErrorsAndAuth(app, service, keys);
  addInfoRoutes(app, service);
  addCompletionRoutes(app, service);
  return app;
}

/** OpenAI-shaped errors and 404s, the responses counter, and each `/v1/*` request's tenant. */
function addErrorsAndAuth(app: Hono<Env>, service: ApiService, keys: ApiKeys | null): void {
  app.onError((error) => (error instanceof ApiError ? error : serverError(error)).response());
  app.notFound((c) =>
    new ApiError(404, "not_found_error", `No route ${c.req.method} ${c.req.path}`, {
      code: "unknown_route",
    }).response()
  );
  app.use("*", async (c, next) => {
    await next();
    service.metrics.responses.inc({ route: c.req.routePath, status: String(c.res.status) });
  });
  app.use("/v1/*", async (c, next) => {
    c.set("tenant", keys ? keys.tenantOf(c.req.header("authorization")) : UNAUTHENTICATED_TENANT);
    await next();
  });
}

/** The routes that only report: health, metrics, the model, the tenant's recent records. */
function addInfoRoutes(app: Hono<Env>, service: ApiService): void {
  const model = service.options.model;
  app.get("/health", (c) =>
    c.json({
      status: "ok",
      model: model.id,
      workers: service.options.peers.workers.length,
      requests_running: service.options.admission.running,
      requests_waiting: service.options.admission.waiting,
    }));
  app.get("/metrics", async (c) => {
    c.header("content-type", service.metrics.contentType);
    return c.body(await service.metrics.text());
  });
  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: [{ id: model.id, object: "model", created: 0, owned_by: "skippy-disagg" }],
    }));
  app.get("/v1/handoffs", (c) => {
    const raw = c.req.query("limit") ?? "20";
    const limit = Number(raw);
    if (!Number.isInteger(limit) || limit < 1 || limit > HANDOFF_RECORDS_MAX) {
      throw new ApiError(
        400,
        "invalid_request_error",
        `Invalid limit "${raw.slice(0, 20)}": must be an integer from 1 to ${HANDOFF_RECORDS_MAX}`,
        { param: "limit", code: "invalid_value" },
      );
    }
    const tenant = c.get("tenant");
    const records = service.options.log.recent(HANDOFF_RECORDS_MAX)
      .filter((r) => r.tenantId === tenant).slice(0, limit);
    return c.json({ object: "list", data: records });
  });
}

/** The generating routes: completions and chat completions, streamed or not. */
function addCompletionRoutes(app: Hono<Env>, service: ApiService): void {
  const model = service.options.model;
  app.post("/v1/completions", async (c) => {
    const body = parseBody(CompletionBody, await readJsonBody(c.req.raw, REQUEST_BODY_BYTES_MAX));
    const params = checkModel(model, toGenerationParams(body));
    const prompt = typeof body.prompt === "string" ? body.prompt : body.prompt[0];
    return await respond(service, c, { endpoint: "completions", params, prompt });
  });
  app.post("/v1/chat/completions", async (c) => {
    const body = parseBody(ChatBody, await readJsonBody(c.req.raw, REQUEST_BODY_BYTES_MAX));
    const params = checkModel(model, toGenerationParams(body));
    const messages = chatMessages(body);
    const { prompt, format, specialSpans } = renderChat(model, messages);
    const turnEnds = userTurnEnds(model, messages, prompt); // prefix checkpoints (issue #12)
    return await respond(service, c, {
      endpoint: "chat.completions",
      params,
      prompt,
      chatFormat: format,
      promptSpecialSpans: specialSpans,
      turnEnds,
    });
  });
}

/**
 * A signal that aborts when the client goes away, watched only while the request runs:
 * Deno.serve also aborts `request.signal` after a successful response (its legacy behaviour),
 * which must not count as a disconnect.
 */
function watchClient(request: Request): { signal: AbortSignal; done: () => void } {
  const gone = new AbortController();
  const onAbort = () => gone.abort();
  request.signal.addEventListener("abort", onAbort, { once: true });
  return {
    signal: gone.signal,
    done: () => request.signal.removeEventListener("abort", onAbort),
  };
}

function parseBody<T extends z.ZodType>(schema: T, json: unknown): z.infer<T> {
  const parsed = schema.safeParse(json);
  if (!parsed.success) throw invalidBody(parsed.error);
  return parsed.data;
}

/** A header value: one line of printable ASCII, bounded. */
function headerSafe(s: string): string {
  return s.replace(/[^\x20-\x7e]/g, "?").slice(0, 300);
}

/** `params`, or a 404 naming the model when it is not the one served here. */
function checkModel(model: ServedModel, params: GenerationParams): GenerationParams {
  if (!namesModel(model, params.model)) {
    throw new ApiError(
      404,
      "not_found_error",
      `The model "${params.model.slice(0, 200)}" does not exist: this server serves "${model.id}"`,
      { code: "model_not_found", param: "model" },
    );
  }
  return params;
}

/** What a completion route hands to `respond`. */
interface Ask {
  endpoint: Endpoint;
  params: GenerationParams;
  prompt: string;
  chatFormat?: ChatFormat;
  promptSpecialSpans?: number[];
  turnEnds?: number[];
}

/** Runs one completion: a whole JSON response, or server-sent events when it streams. */
async function respond(service: ApiService, c: Context<Env>, ask: Ask) {
  const { endpoint, params, prompt, chatFormat, promptSpecialSpans, turnEnds } = ask;
  const model = service.options.model;
  const tenantId: string = c.get("tenant");
  const client = watchClient(c.req.raw);
  if (!params.stream) {
    const out = await service
      .run({
        endpoint,
        params,
        prompt,
        promptSpecialSpans,
        tenantId,
        signal: client.signal,
        chatFormat,
        turnEnds,
      })
      .finally(client.done);
    c.header("x-skippy-placement", out.placement);
    if (out.fallbackReason) c.header("x-skippy-fallback", headerSafe(out.fallbackReason));
    return c.json(wholeResponse(endpoint, params.model, out, (t) => model.pieceBytes(t)));
  }
  const requestId = crypto.randomUUID();
  const chunks = new ChunkWriter(endpoint, params.model, requestId);
  const gone = new AbortController();
  const signal = AbortSignal.any([client.signal, gone.signal]);
  // Writes are queued in order; a write to a closed stream is dropped (the abort frees it).
  let writes = Promise.resolve();
  let send = (_data: string) => {};
  // Context and admission refusals keep their HTTP status: they come before the stream.
  let admitted: Awaited<ReturnType<ApiService["admit"]>>;
  try {
    admitted = await service.admit({
      endpoint,
      params,
      prompt,
      promptSpecialSpans,
      tenantId,
      signal,
      requestId,
      chatFormat,
      turnEnds,
      onDelta: (piece) => send(chunks.text(piece)),
    });
  } catch (error) {
    client.done();
    throw error;
  }
  return streamSSE(c, async (stream) => {
    stream.onAbort(() => gone.abort());
    send = (data: string) => {
      writes = writes.then(() => stream.writeSSE({ data })).catch(() => gone.abort());
    };
    const opening = chunks.opening();
    if (opening) send(opening);
    try {
      const out = await admitted.run();
      send(chunks.finish(out));
      if (params.includeUsage) send(chunks.usage(out));
    } catch (error) {
      if (signal.aborted) return; // the client went away: nothing to tell it
      const api = error instanceof ApiError ? error : serverError(error);
      send(JSON.stringify(api.body()));
    } finally {
      client.done();
    }
    send("[DONE]");
    await writes;
  });
}
