/**
 * Chat messages to a prompt. A model with `tokenizer.chat_template` gets its own template,
 * rendered by `@huggingface/jinja` (the maintained Jinja for JS that transformers.js uses) with
 * `messages`, `add_generation_prompt: true`, `bos_token` and `eos_token`, as llama-server does.
 *
 * A model without a template gets the plain fallback, one `role: content` line per message
 * and a last `assistant:` line for the model to continue:
 *
 *     system: You are terse.
 *     user: Hello
 *     assistant:
 *
 * The workers add BOS themselves when the model asks for it, so a rendered prompt that begins
 * with the BOS token's text has it removed (else the prompt would carry BOS twice).
 *
 * Special-token markers the template writes (such as `<|im_start|>`) become special tokens;
 * the client's message content is always tokenized as text, whatever it contains (a client
 * cannot write a control token). The template's markers travel with the prompt as UTF-8 byte
 * spans (`specialSpans`, api/template_markers.ts) and the workers tokenize those spans as
 * special tokens and everything else as text (serve/prompt_tokens.ts), which equals
 * llama-server's tokenization of the same prompt when the content holds no marker text. A
 * template that rewrites content beyond trimming it cannot be matched: its markers stay text,
 * and the format says so (`model-template-markers-as-text`).
 */
import { Template } from "@huggingface/jinja";
import { ApiError } from "./errors.ts";
import type { ChatMessage } from "./schemas.ts";
import { type MarkerSet, sentinel, templateMarkerSpans } from "./template_markers.ts";

export interface ChatTemplateModel {
  chatTemplate: string | null;
  bosText: string;
  eosText: string;
  addsBos: boolean;
  /** The vocabulary's special-token texts (control and user-defined); absent: none. */
  markers?: MarkerSet;
}

/**
 * Which path rendered a chat prompt (reported in the response's `skippy` field):
 * `model-template-markers-as-text` is the model's template whose markers could not be told
 * apart from content (see the file comment), so they reach the model as text.
 */
export type ChatFormat = "model-template" | "model-template-markers-as-text" | "plain-fallback";

/** A rendered chat prompt and the template's special-token spans in it (UTF-8 bytes). */
export interface RenderedChat {
  prompt: string;
  format: ChatFormat;
  /** Flat `[start, end, ...]` byte spans of the template's markers; empty: none. */
  specialSpans: number[];
}

/** Parsed templates, by source text (a model has one; parsing is the costly part). */
const parsed = new Map<string, Template>();

export function renderChat(model: ChatTemplateModel, messages: ChatMessage[]): RenderedChat {
  if (model.chatTemplate === null) {
    return { prompt: plainChat(messages), format: "plain-fallback", specialSpans: [] };
  }
  let template = parsed.get(model.chatTemplate);
  try {
    if (!template) {
      template = new Template(model.chatTemplate);
      parsed.clear();
      parsed.set(model.chatTemplate, template);
    }
    const render = (ms: ChatMessage[]) => {
      const out = template!.render({
        messages: ms,
        add_generation_prompt: true,
        bos_token: model.bosText,
        eos_token: model.eosText,
      });
      const bos = model.addsBos && model.bosText && out.startsWith(model.bosText);
      return bos ? out.slice(model.bosText.length) : out;
    };
    const prompt = render(messages);
    const markers = model.markers;
    if (!markers || markers.size === 0) {
      return { prompt, format: "model-template", specialSpans: [] };
    }
    let shape: string | null = null;
    try {
      shape = render(messages.map((m, i) => ({ ...m, content: sentinel(i) })));
    } catch {
      // The template looks into content (and refused a sentinel): its shape is unknown.
    }
    const contents = messages.map((m) => m.content);
    const spans = shape === null ? null : templateMarkerSpans(prompt, shape, contents, markers);
    return spans === null
      ? { prompt, format: "model-template-markers-as-text", specialSpans: [] }
      : { prompt, format: "model-template", specialSpans: spans };
  } catch (error) {
    // A template may refuse a conversation (e.g. "roles must alternate"): the client's fault.
    throw new ApiError(
      400,
      "invalid_request_error",
      `The model's chat template refused these messages: ${(error as Error).message}`,
      { code: "chat_template_error", param: "messages" },
    );
  }
}

/** The documented fallback for models without a chat template. */
export function plainChat(messages: ChatMessage[]): string {
  return messages.map((m) => `${m.role}: ${m.content}\n`).join("") + "assistant:";
}
