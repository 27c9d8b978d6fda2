import assert from "node:assert/strict";
import { BOS_ID, buildSpmVocab, EOS_ID, SPACE_MARKER, TokenType, UNK_ID } from "./tokenizer.ts";

Deno.test("buildSpmVocab() puts specials first, then the 256 byte tokens in order", () => {
  const v = buildSpmVocab();
  assert.deepEqual(v.tokens.slice(0, 3), ["<unk>", "<s>", "</s>"]);
  assert.deepEqual([UNK_ID, BOS_ID, EOS_ID], [0, 1, 2]);
  for (let byte = 0; byte < 256; byte++) {
    assert.equal(v.tokens[3 + byte], `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`);
    assert.equal(v.types[3 + byte], TokenType.BYTE);
  }
  assert.equal(v.tokens[3 + 10], "<0x0A>"); // llama.cpp looks up the newline token by this name
});

Deno.test("buildSpmVocab() has unique tokens and a few hundred printable pieces", () => {
  const v = buildSpmVocab();
  assert.equal(new Set(v.tokens).size, v.tokens.length);
  assert.equal(v.scores.length, v.tokens.length);
  assert.equal(v.types.length, v.tokens.length);
  const pieces = v.tokens.slice(259);
  assert.ok(pieces.length >= 300 && pieces.length <= 1000, `${pieces.length} pieces`);
  assert.ok(pieces.every((p) => p.length > 0 && !/\s/.test(p)));
  assert.ok(v.types.slice(259).every((t) => t === TokenType.NORMAL));
  assert.ok(v.scores.every(Number.isFinite));
});

Deno.test("every multi-character piece can be reached by merging two shorter pieces", () => {
  const tokens = new Set(buildSpmVocab().tokens);
  for (const piece of tokens) {
    const chars = [...piece];
    if (chars.length < 2 || piece.startsWith("<")) continue;
    const reachable = chars.some((_, i) =>
      i > 0 && tokens.has(chars.slice(0, i).join("")) && tokens.has(chars.slice(i).join(""))
    );
    assert.ok(reachable, `no merge path to "${piece}"`);
  }
  assert.ok(tokens.has(`${SPACE_MARKER}the`));
});
