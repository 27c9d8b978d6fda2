/**
 * Test helper for huge_pages_test.ts: in a fresh process, as a worker starts, loads the hybrid
 * test model and creates one context with huge pages `on` or `off` (the first argument), and
 * prints as JSON whether the weights were read into huge pages, whether malloc asks for them
 * itself (`mallocHugePages`) and whether memory it maps afresh is in fact huge once written, the
 * context's advice, and the last logits' bytes as hex.
 */
import { prompt, TEST_CONTEXT } from "./_state_testing.ts";
import { testModel } from "../testing/models.ts";
import { toHex } from "../core/mod.ts";
import { LlamaBatch } from "./batch.ts";
import { LlamaContext } from "./context.ts";
import { loadLlama } from "./library.ts";
import { LlamaModel } from "./model.ts";
import { mallocHugePages, smapsEntry } from "./huge_pages.ts";

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
const malloc = mallocHugePages();
const fresh = freshMallocHuge();
console.log(
  JSON.stringify({ weights, malloc, fresh, advice: ctx.hugePages, logits: toHex(bytes) }),
);

/** Whether 70 MiB that malloc maps afresh, once written, sit in huge pages (null: not Linux). */
function freshMallocHuge(): boolean | null {
  if (Deno.build.os !== "linux") return null;
  const c = Deno.dlopen("libc.so.6", {
    malloc: { parameters: ["usize"], result: "pointer" },
    memset: { parameters: ["pointer", "i32", "usize"], result: "pointer" },
  });
  const size = 70 * 1024 * 1024;
  const ptr = c.symbols.malloc(BigInt(size))!;
  c.symbols.memset(ptr, 1, BigInt(size));
  const at = BigInt(Deno.UnsafePointer.value(ptr));
  const entry = smapsEntry(Deno.readTextFileSync("/proc/self/smaps"), at) ?? "";
  return Number(entry.match(/^AnonHugePages:\s+(\d+)/m)?.[1] ?? 0) > 0;
}
