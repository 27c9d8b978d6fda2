/**
 * Where the user turns of a rendered chat prompt end (issue #12): the prefill worker's prefix
 * cache takes a checkpoint there, so the next turn of the same conversation, whose prompt
 * repeats this one up to the end of its last user message, restores it and computes only the
 * assistant's reply and the new message.
 *
 * For each of the last `TURN_ENDS_MAX` user messages, the conversation up to and including it is
 * rendered without a generation prompt (the same template, BOS text stripped as `renderChat`
 * does); when that text is a prefix of the whole prompt, its length is a turn end. A template
 * that renders a partial conversation differently (or refuses it) just yields no offset there:
 * the hint only chooses checkpoints, and every hit is checked token by token.
 */
import { Template } from "@huggingface/jinja";
import type { ChatTemplateModel } from "./chat.ts";
import type { ChatMessage } from "./schemas.ts";
import { TURN_ENDS_MAX } from "../serve/messages.ts";

const parsed = new Map<string, Template>();

/** UTF-16 offsets into `prompt` where a user turn ends, ascending (at most TURN_ENDS_MAX). */
export function userTurnEnds(
  model: ChatTemplateModel,
  messages: ChatMessage[],
  prompt: string,
): number[] {
  const users = messages.flatMap((m, i) => (m.role === "user" ? [i] : [])).slice(-TURN_ENDS_MAX);
  const ends: number[] = [];
  for (const i of users) {
    const head = renderHead(model, messages.slice(0, i + 1));
    if (head !== null && head.length > 0 && head.length < prompt.length) {
      if (prompt.startsWith(head) && (ends.length === 0 || head.length > ends.at(-1)!)) {
        ends.push(head.length);
      }
    }
  }
  return ends;
}

/** The conversation so far without a generation prompt, or null if the template refuses it. */
function renderHead(model: ChatTemplateModel, messages: ChatMessage[]): string | null {
  if (model.chatTemplate === null) return messages.map((m) => `${m.role}: ${m.content}\n`).join("");
  try {
    let template = parsed.get(model.chatTemplate);
    if (!template) {
      template = new Template(model.chatTemplate);
      parsed.clear();
      parsed.set(model.chatTemplate, template);
    }
    let text = template.render({
      messages,
      add_generation_prompt: false,
      bos_token: model.bosText,
      eos_token: model.eosText,
    });
    if (model.addsBos && model.bosText && text.startsWith(model.bosText)) {
      text = text.slice(model.bosText.length);
    }
    return text;
  } catch {
    return null;
  }
}
