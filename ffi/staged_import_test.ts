import assert from "node:assert/strict";
import { IdentityMismatchError } from "../core/errors.ts";
import { LlamaBatch } from "./batch.ts";
import type { ContextOptions } from "./context.ts";
import { HandoffPair, prompt } from "./_state_testing.ts";
import { type ExportedState, prefillAndExport } from "./state_driver.ts";
import { StagedImport } from "./staged_import.ts";
import { exportKvPage } from "./state.ts";
import { loadLlama } from "./library.ts";
import { loadShim } from "./shim/shim.ts";

const N = 1024;
const CHUNK = 256;
const shimOk = (await loadShim(loadLlama())).ok;
const PATHS = shimOk ? (["auto", "public"] as const) : (["public"] as const);

/** Decoding through a context held by an uncommitted import must throw. */
async function assertCannotDecode(pair: HandoffPair) {
  const batch = new LlamaBatch(1);
  batch.fill([5], N);
  await assert.rejects(pair.b.decode(batch), /uncommitted state import/);
}

async function staged(
  family: string,
  path: "auto" | "public",
  overB: Partial<ContextOptions> = {},
): Promise<{ pair: HandoffPair; state: ExportedState; imp: StagedImport }> {
  const pair = await HandoffPair.open(family, {}, overB);
  const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
  const imp = await StagedImport.open(pair.b, { nTokens: N, path });
  return { pair, state, imp };
}

/** Asserts `action` is refused with `pattern` and the import stays uncommitted. */
async function assertRefused(
  s: { pair: HandoffPair; imp: StagedImport },
  action: () => Promise<unknown>,
  pattern: RegExp,
) {
  await assert.rejects(action, pattern);
  assert.equal(s.imp.state, "staging");
  await assertCannotDecode(s.pair);
}

for (const path of PATHS) {
  Deno.test(`[${path}] a missing page is refused at commit, naming its range`, async () => {
    const s = await staged("hybrid", path);
    using _ = s.pair;
    for (const i of [0, 2, 3]) await s.imp.addPage(s.state.pages[i]);
    await s.imp.setRecurrent(s.state.recurrent!);
    await assertRefused(s, () => s.imp.commit(), /kv-page tokens \[256, 512\) missing/);
  });

  Deno.test(`[${path}] a duplicated page is refused when it arrives`, async () => {
    const s = await staged("dense", path);
    using _ = s.pair;
    await s.imp.addPage(s.state.pages[1]);
    await assertRefused(s, () => s.imp.addPage(s.state.pages[1]), /tokens \[256, 512\).*overlaps/);
    // A page straddling one already staged is refused the same way.
    const straddling = await exportKvPage(s.pair.a, 128, 384, { path });
    await assertRefused(s, () => s.imp.addPage(straddling), /\[128, 384\).*overlaps.*\[256, 512\)/);
  });

  Deno.test(`[${path}] a page with one flipped byte is refused by its checksum`, async () => {
    const s = await staged("dense", path);
    using _ = s.pair;
    const page = s.state.pages[2].slice();
    page[page.length - 100] ^= 0x40; // inside the V rows
    await assertRefused(s, () => s.imp.addPage(page), /kv-page tokens \[512, 768\).*checksum/);
    // The intact page still goes in afterwards: nothing was half-applied.
    await s.imp.addPage(s.state.pages[2]);
  });

  Deno.test(`[${path}] a page of another K/V type is refused`, async () => {
    const s = await staged("dense", path, { typeK: "f32", typeV: "f32" });
    using _ = s.pair;
    await assertRefused(
      s,
      () => s.imp.addPage(s.state.pages[0]),
      /kv-page tokens \[0, 256\).*K type/,
    );
    await assert.rejects(s.imp.addPage(s.state.pages[0]), IdentityMismatchError);
  });

  Deno.test(`[${path}] a page with the other flash attention setting is refused`, async () => {
    const s = await staged("hybrid", path, { flashAttention: true });
    using _ = s.pair;
    await assertRefused(
      s,
      () => s.imp.addPage(s.state.pages[0]),
      /kv-page tokens \[0, 256\).*flash attention/,
    );
  });

  Deno.test(`[${path}] a page from a larger context is refused (n_ctx too small)`, async () => {
    const s = await staged("dense", path, { nCtx: 1536 });
    using _ = s.pair;
    await assertRefused(
      s,
      () => s.imp.addPage(s.state.pages[0]),
      /kv-page tokens \[0, 256\).*2048 cells/,
    );
  });

  Deno.test(`[${path}] a hybrid import without its recurrent snapshot is refused at commit`, async () => {
    const s = await staged("hybrid", path);
    using _ = s.pair;
    for (const page of s.state.pages) await s.imp.addPage(page);
    await assertRefused(s, () => s.imp.commit(), /conv\/ssm tokens \[0, 1024\) missing/);
  });

  Deno.test(`[${path}] abort wipes the sequence and gives the context back`, async () => {
    const s = await staged("hybrid", path);
    using _ = s.pair;
    for (const page of s.state.pages.slice(0, 2)) await s.imp.addPage(page);
    await s.imp.abort();
    assert.equal(s.imp.state, "aborted");
    assert.equal(s.pair.b.seqPosMax(0), -1);
    const batch = new LlamaBatch(4);
    batch.fill([5, 6, 7, 8], 0);
    await s.pair.b.decode(batch); // usable again, from an empty sequence
    await assert.rejects(s.imp.addPage(s.state.pages[2]), /aborted/);
  });
}

Deno.test("a stale recurrent snapshot is refused before it is imported", async () => {
  using pair = await HandoffPair.open("hybrid");
  const early = await prefillAndExport(pair.a, prompt(N - CHUNK), { chunkTokens: CHUNK });
  pair.a.clearMemory();
  const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
  const imp = await StagedImport.open(pair.b, { nTokens: N });
  for (const page of state.pages) await imp.addPage(page);
  await assert.rejects(
    imp.setRecurrent(early.recurrent!),
    /conv\/ssm .*position 767, expected 1023/,
  );
  await imp.setRecurrent(state.recurrent!);
  await imp.commit();
});

Deno.test("a page beyond the handoff's tokens is refused", async () => {
  using pair = await HandoffPair.open("dense");
  const state = await prefillAndExport(pair.a, prompt(N), { chunkTokens: CHUNK });
  const imp = await StagedImport.open(pair.b, { nTokens: 512 });
  await assert.rejects(imp.addPage(state.pages[3]), /tokens \[768, 1024\).*outside/);
});

Deno.test("an import opens only on an empty, unheld sequence", async () => {
  using pair = await HandoffPair.open("dense");
  const imp = await StagedImport.open(pair.b, { nTokens: N });
  await assert.rejects(StagedImport.open(pair.b, { nTokens: N }), /already holds state/);
  await imp.abort();
  const batch = new LlamaBatch(2);
  batch.fill([5, 6], 0);
  await pair.b.decode(batch);
  await assert.rejects(StagedImport.open(pair.b, { nTokens: N }), /already holds state/);
});
