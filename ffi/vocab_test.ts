import assert from "node:assert/strict";
import { testModel } from "../testing/models.ts";
import { LlamaModel, loadLlama } from "./mod.ts";

Deno.test("a special token's text in a prompt becomes that token (as llama-server parses prompts)", async () => {
  using model = await LlamaModel.load(loadLlama(), await testModel("hybrid"));
  const vocab = model.vocab;
  // `</s>` is the test vocabulary's EOS; as plain text it would be several byte pieces.
  const parsed = vocab.tokenize("a</s>b", false);
  const plain = vocab.tokenize("a</s>b", false, false);
  assert.ok(Array.from(parsed).includes(vocab.eos), "the special token is parsed");
  assert.ok(!Array.from(plain).includes(vocab.eos), "without parsing it stays text");
  assert.ok(plain.length > parsed.length);
});
