/**
 * Test helper for huge_pages_test.ts: in a fresh process, as a worker starts, loads the hybrid
 * test model and creates one context with huge pages `on` or `off` (the first argument), and
 * prints as JSON whether the weights were read into huge pages, the context's advice, and the
 * last logits' bytes as hex.
 */
import { prompt, TEST_CONTEXT } from "./_state_testing.ts";
import { testModel } from "../testing/models.ts";
import { toHex } from "../core/mod.ts";
import { LlamaBatch } from "./batch.ts";
import { LlamaContext } from "./context.ts";
import { loadLlama } from "./library.ts";
import { LlamaModel } from "./model.ts";

const hugePages = Deno.args[0] === "on";
using model = await LlamaModel.load(loadLlama(), await testModel("hybrid"), { hugePages });
using ctx = await LlamaContext.create(model, { ...TEST_CONTEXT, hugePages });
const tokens = prompt(96);
const batch = new LlamaBatch(tokens.length);
batch.fill(tokens, 0, true);
await ctx.decode(batch);
const logits = ctx.logits(-1);
const bytes = new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength);
const weights = model.weightsInHugePages;
console.log(JSON.stringify({ weights, advice: ctx.hugePages, logits: toHex(bytes) }));
