/**
 * Errors in OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`, with the types
 * llama-server uses (`invalid_request_error` 400, `exceed_context_size_error` 400,
 * `authentication_error` 401, `not_found_error` 404, `unavailable_error` 503, `server_error`
 * 500). Every message is one line, names the field or bound, and never quotes prompt content.
 */
import type { z } from "zod";
import { WorkerBusyError } from "../core/mod.ts";

/** Retry-After, in seconds, for a 503 because a worker had no room. */
export const WORKER_BUSY_RETRY_AFTER_S = 1;

export type ApiErrorType =
  | "invalid_request_error"
  | "exceed_context_size_error"
  | "authentication_error"
  | "not_found_error"
  | "unavailable_error"
  | "server_error";

/** An error the API answers with (status, type and one line); thrown by handlers. */
export class ApiError extends Error {
  constructor(
    readonly status: 400 | 401 | 404 | 413 | 500 | 503,
    readonly type: ApiErrorType,
    message: string,
    readonly options: {
      code?: string | null;
      param?: string | null;
      /** Extra fields beside `message` (e.g. n_prompt_tokens and n_ctx). */
      extra?: Record<string, unknown>;
      /** Seconds, for 503. */
      retryAfterS?: number;
    } = {},
  ) {
    super(message);
    this.name = "ApiError";
  }

  /** The JSON body. */
  body(): { error: Record<string, unknown> } {
    return {
      error: {
        message: this.message,
        type: this.type,
        code: this.options.code ?? this.type,
        param: this.options.param ?? null,
        ...this.options.extra,
      },
    };
  }

  /** The HTTP response (with Retry-After on 503). */
  response(): Response {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.options.retryAfterS !== undefined) {
      headers["retry-after"] = String(this.options.retryAfterS);
    }
    return new Response(JSON.stringify(this.body()), { status: this.status, headers });
  }
}

/** 400 for a request body zod refused: the first issue, as one line naming its field. */
export function invalidBody(error: z.ZodError): ApiError {
  const issue = error.issues[0];
  const param = issue?.path.length ? issue.path.map(String).join(".") : null;
  const more = error.issues.length > 1 ? ` (and ${error.issues.length - 1} more problems)` : "";
  const message = param
    ? `Invalid field "${param}": ${issue.message}${more}`
    : `Invalid request body: ${issue?.message ?? "not an object"}${more}`;
  return new ApiError(400, "invalid_request_error", message, {
    code: "invalid_value",
    param,
  });
}

/** 400 for a body that is not JSON at all. */
export function malformedJson(detail: string): ApiError {
  return new ApiError(
    400,
    "invalid_request_error",
    `The request body is not valid JSON: ${detail}`,
    { code: "invalid_json" },
  );
}

/** 400 naming the prompt's size and the context (llama-server's exceed_context_size_error). */
export function contextTooSmall(promptTokens: number, maxTokens: number, nCtx: number): ApiError {
  return new ApiError(
    400,
    "exceed_context_size_error",
    `The prompt (${promptTokens} tokens) plus max_tokens (${maxTokens}) exceeds the context ` +
      `of ${nCtx} tokens: shorten the prompt or lower max_tokens`,
    {
      code: "exceed_context_size_error",
      param: "max_tokens",
      extra: { n_prompt_tokens: promptTokens, n_ctx: nCtx },
    },
  );
}

/**
 * 500 for a worker failure: one line, the worker's own message (never content); 503 with
 * Retry-After when a worker had no room (WorkerBusyError: the request can simply be retried).
 */
export function serverError(error: unknown): ApiError {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof WorkerBusyError) {
    return new ApiError(503, "unavailable_error", firstLine(message), {
      code: "worker_busy",
      retryAfterS: WORKER_BUSY_RETRY_AFTER_S,
    });
  }
  return new ApiError(500, "server_error", firstLine(message), { code: "server_error" });
}

function firstLine(s: string): string {
  const line = s.split("\n")[0].trim();
  return line.length > 500 ? `${line.slice(0, 500)}...` : line || "internal error";
}
