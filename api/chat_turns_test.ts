import assert from "node:assert/strict";
import { renderChat } from "./chat.ts";
import { userTurnEnds } from "./chat_turns.ts";
import { DENSE_CHAT_TEMPLATE } from "../models/mod.ts";
import { parseMessage, type PrefillRequest, TURN_ENDS_MAX } from "../serve/messages.ts";

const conversation = [
  { role: "system", content: "Be terse." },
  { role: "user", content: "Hello" },
  { role: "assistant", content: "Hi." },
  { role: "user", content: "Tell me more" },
];

Deno.test("userTurnEnds: the end of each user message in the rendered template prompt", () => {
  const model = {
    chatTemplate: DENSE_CHAT_TEMPLATE,
    bosText: "<s>",
    eosText: "</s>",
    addsBos: true,
  };
  const { prompt } = renderChat(model, conversation);
  const ends = userTurnEnds(model, conversation, prompt);
  assert.deepEqual(ends.map((e) => prompt.slice(0, e)), [
    "<|system|>\nBe terse.\n<|user|>\nHello\n",
    "<|system|>\nBe terse.\n<|user|>\nHello\n<|assistant|>\nHi.\n<|user|>\nTell me more\n",
  ]);
  // The first turn's request rendered then: its end is where this prompt's first turn ends,
  // so a follow-up restores the checkpoint taken there.
  const first = renderChat(model, conversation.slice(0, 2)).prompt;
  assert.equal(userTurnEnds(model, conversation.slice(0, 2), first)[0], ends[0]);
  assert.ok(prompt.startsWith(first.slice(0, ends[0])));
  // With the template's BOS text kept (a model that does not add BOS), the offsets count it.
  const withBos = { ...model, addsBos: false };
  const bosPrompt = renderChat(withBos, conversation).prompt;
  assert.deepEqual(userTurnEnds(withBos, conversation, bosPrompt), ends.map((e) => e + 3));
});

Deno.test("userTurnEnds: the plain fallback, a bounded count, and nothing a template refuses", () => {
  const plain = { chatTemplate: null, bosText: "", eosText: "", addsBos: true };
  const { prompt } = renderChat(plain, conversation);
  const ends = userTurnEnds(plain, conversation, prompt);
  assert.deepEqual(ends.map((e) => prompt.slice(0, e)), [
    "system: Be terse.\nuser: Hello\n",
    "system: Be terse.\nuser: Hello\nassistant: Hi.\nuser: Tell me more\n",
  ]);
  const long = Array.from({ length: 40 }, (_, i) => ({
    role: i % 2 === 0 ? "user" : "assistant",
    content: `message ${i}`,
  }));
  const longEnds = userTurnEnds(plain, long, renderChat(plain, long).prompt);
  assert.equal(longEnds.length, TURN_ENDS_MAX);
  assert.ok(longEnds.every((e, i) => i === 0 || e > longEnds[i - 1]));
  // A template that fails on a partial conversation gives no offset there, and no error.
  const picky = {
    ...plain,
    chatTemplate: "{% if messages|length < 4 %}{{ raise_exception('too short') }}{% endif %}" +
      "{% for m in messages %}{{ m['content'] }}|{% endfor %}",
  };
  const full = renderChat(picky, conversation).prompt;
  const pickyEnds = userTurnEnds(picky, conversation, full);
  assert.deepEqual(pickyEnds, []); // the last turn's end is the prompt's end: not a checkpoint
});

Deno.test("PrefillRequest.turnEnds: ascending offsets, at most TURN_ENDS_MAX, else a named refusal", () => {
  const request = (turnEnds: unknown) => ({
    type: "PrefillRequest",
    handoffId: "h1",
    tenantId: "t",
    prompt: "hello there",
    generateTokens: 4,
    sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
    decode: { host: "127.0.0.1", port: 7701, nodeId: "n" },
    probe: false,
    turnEnds,
  });
  assert.deepEqual(parseMessage<PrefillRequest>(request([3, 7])).turnEnds, [3, 7]);
  for (
    const bad of [
      [7, 3],
      [-1],
      [1.5],
      "3",
      Array.from({ length: TURN_ENDS_MAX + 1 }, (_, i) => i),
    ]
  ) {
    assert.throws(() => parseMessage(request(bad)), /Malformed PrefillRequest: field "turnEnds"/);
  }
});
