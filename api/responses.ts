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

/** A token's piece as bytes (may be part of a UTF-8 character), from the model's vocabulary. */
export type PieceBytes = (token: number) => Uint8Array;

/**
 * OpenAI's `logprobs` of a choice: completions' legacy shape (`tokens`, `token_logprobs`,
 * `top_logprobs` as objects, `text_offset`) or chat's (`content`: token, logprob, bytes,
 * `top_logprobs`). Token strings are the pieces decoded as UTF-8 (a piece holding part of a
 * character shows U+FFFD; chat's `bytes` are exact). A token no worker had logits for has a
 * null logprob and no alternatives.
 */
export function logprobsField(endpoint: Endpoint, out: RunOutput, piece: PieceBytes) {
  if (out.logprobs === null) return null;
  const { tokens, logprobs } = out.logprobs;
  const text = (t: number) => new TextDecoder().decode(piece(t));
  if (endpoint === "completions") {
    let offset = 0;
    const textOffset = tokens.map((t) => {
      const at = offset;
      offset += text(t).length;
      return at;
    });
    return {
      tokens: tokens.map(text),
      token_logprobs: logprobs.map((lp) => lp?.logprob ?? null),
      top_logprobs: logprobs.map((lp) =>
        lp ? Object.fromEntries(lp.top.map(([t, v]) => [text(t), v])) : null
      ),
      text_offset: textOffset,
    };
  }
  const entry = (t: number, logprob: number | null) => ({
    token: text(t),
    logprob,
    bytes: [...piece(t)],
  });
  return {
    content: tokens.map((t, i) => ({
      ...entry(t, logprobs[i]?.logprob ?? null),
      top_logprobs: (logprobs[i]?.top ?? []).map(([a, v]) => entry(a, v)),
    })),
    refusal: null,
  };
}

/** The non-streaming body. */
export function wholeResponse(
  endpoint: Endpoint,
  model: string,
  out: RunOutput,
  piece: PieceBytes = () => new Uint8Array(0),
) {
  const base = { id: idFor(endpoint, out.requestId), created: out.created, model };
  const logprobs = logprobsField(endpoint, out, piece);
  const choice = endpoint === "completions"
    ? { index: 0, text: out.text, finish_reason: out.finishReason, logprobs }
    : {
      index: 0,
      message: { role: "assistant", content: out.text },
      finish_reason: out.finishReason,
      logprobs,
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
