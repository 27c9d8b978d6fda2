/**
 * OpenAI's response shapes for completions and chat completions, whole and as stream chunks.
 * Beside OpenAI's fields, each final object carries a `skippy` field: where the request ran,
 * why, and any fallback (no content).
 */
import type { RunOutput } from "./service.ts";

export type Endpoint = "completions" | "chat.completions";

export function idFor(endpoint: Endpoint, requestId: string): string {
  return `${endpoint === "completions" ? "cmpl" : "chatcmpl"}-${requestId}`;
}

function usage(out: RunOutput) {
  return {
    prompt_tokens: out.promptTokens,
    prompt_tokens_details: { cached_tokens: out.cachedTokens },
    completion_tokens: out.completionTokens,
    total_tokens: out.promptTokens + out.completionTokens,
  };
}

export function skippyField(out: RunOutput) {
  return {
    placement: out.placement,
    planned_placement: out.plannedPlacement.placement,
    placement_reason: out.plannedPlacement.reason,
    fallback_reason: out.fallbackReason,
    ...(out.chatFormat ? { chat_format: out.chatFormat } : {}),
  };
}

/** The non-streaming body. */
export function wholeResponse(endpoint: Endpoint, model: string, out: RunOutput) {
  const base = { id: idFor(endpoint, out.requestId), created: out.created, model };
  const choice = endpoint === "completions"
    ? { index: 0, text: out.text, finish_reason: out.finishReason, logprobs: null }
    : {
      index: 0,
      message: { role: "assistant", content: out.text },
      finish_reason: out.finishReason,
      logprobs: null,
    };
  return {
    ...base,
    object: endpoint === "completions" ? "text_completion" : "chat.completion",
    choices: [choice],
    usage: usage(out),
    skippy: skippyField(out),
  };
}

/** Builds the chunks of one stream (the id and time are fixed when the stream starts). */
export class ChunkWriter {
  readonly id: string;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(readonly endpoint: Endpoint, readonly model: string, requestId: string) {
    this.id = idFor(endpoint, requestId);
  }

  #chunk(choices: unknown[], extra: Record<string, unknown> = {}) {
    return JSON.stringify({
      id: this.id,
      object: this.endpoint === "completions" ? "text_completion" : "chat.completion.chunk",
      created: this.created,
      model: this.model,
      choices,
      ...extra,
    });
  }

  /** Chat streams open with the assistant role (OpenAI's first delta). */
  opening(): string | null {
    if (this.endpoint === "completions") return null;
    return this.#chunk([{
      index: 0,
      delta: { role: "assistant", content: "" },
      finish_reason: null,
      logprobs: null,
    }]);
  }

  text(piece: string): string {
    return this.#chunk([
      this.endpoint === "completions"
        ? { index: 0, text: piece, finish_reason: null, logprobs: null }
        : { index: 0, delta: { content: piece }, finish_reason: null, logprobs: null },
    ]);
  }

  /** The chunk with the finish reason (and the `skippy` field). */
  finish(out: RunOutput): string {
    return this.#chunk([
      this.endpoint === "completions"
        ? { index: 0, text: "", finish_reason: out.finishReason, logprobs: null }
        : { index: 0, delta: {}, finish_reason: out.finishReason, logprobs: null },
    ], { skippy: skippyField(out) });
  }

  /** With `stream_options.include_usage`: a last chunk with no choices and the usage. */
  usage(out: RunOutput): string {
    return this.#chunk([], { usage: usage(out) });
  }
}
