/**
 * Test helper for huge_pages_test.ts: in a fresh process, as a worker creates its contexts,
 * creates one context on the hybrid test model (`--huge-pages on|off` as the first argument)
 * and prints its `hugePages` advice and the last logits' bytes as hex, as JSON.
 */
import { prompt, TEST_CONTEXT } from "./_state_testing.ts";
import { testModel } from "../testing/models.ts";
import { toHex } from "../core/mod.ts";
import { LlamaBatch } from "./batch.ts";
import { LlamaContext } from "./context.ts";
import { loadLlama } from "./library.ts";
import { LlamaModel } from "./model.ts";

using model = await LlamaModel.load(loadLlama(), await testModel("hybrid"), {});
using ctx = await LlamaContext.create(model, { ...TEST_CONTEXT, hugePages: Deno.args[0] === "on" });
const tokens = prompt(96);
const batch = new LlamaBatch(tokens.length);
batch.fill(tokens, 0, true);
await ctx.decode(batch);
const logits = ctx.logits(-1);
const bytes = new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength);
console.log(JSON.stringify({ advice: ctx.hugePages, logits: toHex(bytes) }));
