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
 * The workers tokenize the prompt as text and add BOS themselves when the model asks for it,
 * so a rendered prompt that begins with the BOS token's text has it removed (else the prompt
 * would carry BOS twice, once as text). Special-token markers a template writes (such as
 * `<|im_start|>`) are tokenized as text by the workers today: see api/README.md.
 */
import { Template } from "@huggingface/jinja";
import { ApiError } from "./errors.ts";
import type { ChatMessage } from "./schemas.ts";

export interface ChatTemplateModel {
  chatTemplate: string | null;
  bosText: string;
  eosText: string;
  addsBos: boolean;
}

/** Which path rendered a chat prompt (reported in the response's `skippy` field). */
export type ChatFormat = "model-template" | "plain-fallback";

/** Parsed templates, by source text (a model has one; parsing is the costly part). */
const parsed = new Map<string, Template>();

export function renderChat(
  model: ChatTemplateModel,
  messages: ChatMessage[],
): { prompt: string; format: ChatFormat } {
  if (model.chatTemplate === null) return { prompt: plainChat(messages), format: "plain-fallback" };
  let template = parsed.get(model.chatTemplate);
  try {
    if (!template) {
      template = new Template(model.chatTemplate);
      parsed.clear();
      parsed.set(model.chatTemplate, template);
    }
    let prompt = template.render({
      messages,
      add_generation_prompt: true,
      bos_token: model.bosText,
      eos_token: model.eosText,
    });
    if (model.addsBos && model.bosText && prompt.startsWith(model.bosText)) {
      prompt = prompt.slice(model.bosText.length);
    }
    return { prompt, format: "model-template" };
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
