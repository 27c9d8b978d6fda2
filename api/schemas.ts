/**
 * Request bodies of `/v1/completions` and `/v1/chat/completions`, as zod schemas: the fields
 * this server honours are checked for type and range; fields it cannot honour are refused by
 * name (`n` > 1, `echo`, `suffix`, penalties, `logprobs` with `stream`); unknown fields are
 * ignored, as OpenAI clients send many. `toGenerationParams` turns either body into one shape.
 */
import { z } from "zod";
import { ApiError } from "./errors.ts";

/** Most stop sequences per request (OpenAI's limit), and the longest one, in characters. */
export const STOP_SEQUENCES_MAX = 4;
export const STOP_CHARS_MAX = 256;
/** Most chat messages in one request. */
export const CHAT_MESSAGES_MAX = 4096;

const stop = z.union([
  z.string().min(1).max(STOP_CHARS_MAX),
  z.array(z.string().min(1).max(STOP_CHARS_MAX)).max(STOP_SEQUENCES_MAX),
]).nullish();

/** Fields both endpoints share. */
const common = {
  model: z.string().min(1).max(1024),
  max_tokens: z.int().min(1).nullish(),
  max_completion_tokens: z.int().min(1).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  stop,
  seed: z.int().min(0).max(0xffffffff).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  /** An extension llama-server also takes. */
  top_k: z.int().min(0).max(1 << 20).nullish(),
  n: z.int().min(1).max(128).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  user: z.string().max(1024).nullish(),
};

export const CompletionBody = z.object({
  ...common,
  prompt: z.union([z.string(), z.array(z.string()).min(1).max(1)]),
  logprobs: z.int().min(0).max(20).nullish(),
  echo: z.boolean().nullish(),
  suffix: z.string().nullish(),
});
export type CompletionBody = z.infer<typeof CompletionBody>;

const textPart = z.object({ type: z.literal("text"), text: z.string() });
const message = z.object({
  role: z.enum(["system", "developer", "user", "assistant", "tool"]),
  content: z.union([z.string(), z.array(textPart).max(CHAT_MESSAGES_MAX)]).nullish(),
  name: z.string().max(256).nullish(),
});
export type ChatMessage = { role: string; content: string };

export const ChatBody = z.object({
  ...common,
  messages: z.array(message).min(1).max(CHAT_MESSAGES_MAX),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.int().min(0).max(20).nullish(),
});
export type ChatBody = z.infer<typeof ChatBody>;

/** What a request asks for, whichever endpoint it came through. */
export interface GenerationParams {
  model: string;
  /** Null: the endpoint's default (see `maxTokensDefault` in the service). */
  maxTokens: number | null;
  stream: boolean;
  includeUsage: boolean;
  stop: string[];
  temperature: number;
  topP: number;
  topK: number;
  /** Null: the server draws one. */
  seed: number | null;
  /** Log probabilities with this many alternatives per token (0..20); null: none. */
  logprobs: number | null;
}

/** Defaults when a field is absent: OpenAI's temperature and top_p, llama-server's top_k. */
export const SAMPLING_DEFAULTS = { temperature: 1, topP: 1, topK: 40 } as const;

/** Refuses what this server cannot honour, naming the field; returns the common shape. */
export function toGenerationParams(body: CompletionBody | ChatBody): GenerationParams {
  const refuse = (param: string, why: string) => {
    throw new ApiError(400, "invalid_request_error", `Unsupported field "${param}": ${why}`, {
      code: "unsupported_value",
      param,
    });
  };
  if ((body.n ?? 1) > 1) refuse("n", "only n = 1 is served; send several requests instead");
  if (body.frequency_penalty || body.presence_penalty) {
    refuse(
      body.frequency_penalty ? "frequency_penalty" : "presence_penalty",
      "penalties are not implemented by this server's sampler; leave them at 0",
    );
  }
  if ("echo" in body && body.echo) refuse("echo", "echoing the prompt is not supported");
  if ("suffix" in body && body.suffix) refuse("suffix", "insertion (suffix) is not supported");
  const logprobs = "messages" in body
    ? (body.logprobs ? body.top_logprobs ?? 0 : null)
    : body.logprobs ?? null;
  if ("messages" in body && !body.logprobs && body.top_logprobs != null) {
    refuse("top_logprobs", 'it needs "logprobs": true');
  }
  if (logprobs !== null && body.stream) {
    refuse(
      "logprobs",
      "log probabilities are returned for non-streaming requests only; set stream to false",
    );
  }
  const stop = body.stop == null ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
  return {
    model: body.model,
    maxTokens: body.max_completion_tokens ?? body.max_tokens ?? null,
    stream: body.stream ?? false,
    includeUsage: body.stream_options?.include_usage ?? false,
    stop,
    temperature: body.temperature ?? SAMPLING_DEFAULTS.temperature,
    topP: body.top_p ?? SAMPLING_DEFAULTS.topP,
    topK: body.top_k ?? SAMPLING_DEFAULTS.topK,
    seed: body.seed ?? null,
    logprobs,
  };
}

/** A chat body's messages with their content as one string each (text parts joined). */
export function chatMessages(body: ChatBody): ChatMessage[] {
  return body.messages.map((m) => ({
    role: m.role,
    content: typeof m.content === "string"
      ? m.content
      : (m.content ?? []).map((p) => p.text).join(""),
  }));
}
