import assert from "node:assert/strict";
import { renderChat } from "./chat.ts";
import { ApiError } from "./errors.ts";
import { DENSE_CHAT_TEMPLATE } from "../models/mod.ts";

const messages = [
  { role: "system", content: "Be terse." },
  { role: "user", content: "Hello" },
];

Deno.test("renderChat renders the model's template with a generation prompt and one BOS", () => {
  const model = { chatTemplate: DENSE_CHAT_TEMPLATE, bosText: "<s>", eosText: "</s>" };
  const withBos = renderChat({ ...model, addsBos: true }, messages);
  assert.equal(withBos.format, "model-template");
  // The workers add BOS: the template's BOS text is removed, the rest is the template's.
  assert.equal(withBos.prompt, "<|system|>\nBe terse.\n<|user|>\nHello\n<|assistant|>\n");
  const noBos = renderChat({ ...model, addsBos: false }, messages);
  assert.equal(noBos.prompt, "<s>" + withBos.prompt);
});

Deno.test("renderChat falls back to role: content lines without a template", () => {
  const r = renderChat({ chatTemplate: null, bosText: "", eosText: "", addsBos: true }, messages);
  assert.equal(r.format, "plain-fallback");
  assert.equal(r.prompt, "system: Be terse.\nuser: Hello\nassistant:");
});

Deno.test("renderChat turns a template's raise_exception into a 400 naming messages", () => {
  const strict =
    "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}" +
    "{% endif %}{{ messages[0]['content'] }}";
  assert.throws(
    () => renderChat({ chatTemplate: strict, bosText: "", eosText: "", addsBos: false }, messages),
    (e: unknown) => e instanceof ApiError && e.status === 400 && e.options.param === "messages",
  );
});
