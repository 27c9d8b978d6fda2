import assert from "node:assert/strict";
import { HandoffPair, prompt } from "../_state_testing.ts";
import { prefillAndExport } from "../state_driver.ts";
import { pageCrc, pageRows, readPageHeader } from "../_state_page.ts";
import { loadLlama } from "../library.ts";
import { checkIdentity, loadShim, type Shim, ShimCallError } from "./shim.ts";
import { SHIM_PAGE, SHIM_RC } from "./abi.ts";

const lib = loadLlama();
const status = await loadShim(lib);

/** A test that needs the shim; skipped, saying why, when it could not be built or loaded. */
function shimTest(name: string, fn: (shim: Shim) => Promise<void>) {
  const why = status.ok ? "" : ` (skipped: ${status.reason})`;
  Deno.test({
    name: name + why,
    ignore: !status.ok,
    fn: () => fn((status as { shim: Shim }).shim),
  });
}

async function refusedWith(p: Promise<unknown>, code: number, pattern: RegExp) {
  await assert.rejects(
    p,
    (e) => e instanceof ShimCallError && e.code === code && pattern.test(e.message),
  );
}

shimTest("the shim matches the loaded library's build id and refuses another", (shim) => {
  assert.equal(checkIdentity(shim.symbols, lib.buildId), null);
  assert.match(checkIdentity(shim.symbols, "00".repeat(20)) ?? "", /built for libllama/);
  return Promise.resolve();
});

shimTest("memory kinds are exact types, and every family passes the self-test", async (shim) => {
  const expected: Record<string, string> = {
    dense: "kv",
    iswa: "iswa",
    recurrent: "recurrent",
    hybrid: "hybrid",
    "hybrid-moe-mtp": "hybrid",
  };
  for (const [family, kind] of Object.entries(expected)) {
    using pair = await HandoffPair.open(family);
    assert.equal(shim.memoryKind(pair.a), kind, family);
    assert.equal(shim.selfTest(pair.a), null, family);
    if (pair.draftA) {
      assert.equal(shim.memoryKind(pair.draftA), "kv"); // the MTP draft's own KV cache
      assert.equal(shim.selfTest(pair.draftA), null);
    }
  }
});

shimTest("a shim page parses in TypeScript and carries a matching checksum", async (shim) => {
  using pair = await HandoffPair.open("hybrid");
  await prefillAndExport(pair.a, prompt(512), { chunkTokens: 256 });
  const page = await shim.exportPage(pair.a, "main", 0, 100, 300);
  const h = readPageHeader(page, "kv-page");
  assert.deepEqual([h.p0, h.p1, h.cellCount, h.nRanges, h.kvSize, h.nLayer], [
    100,
    300,
    200,
    1,
    2048,
    2,
  ]);
  assert.equal(h.flags, SHIM_PAGE.FLAG_PLACED | SHIM_PAGE.FLAG_VTRANS);
  assert.equal(pageCrc(page), h.crc);
  const rows = pageRows(page, h, "kv-page");
  assert.equal(rows.k.length, 2);
  assert.equal(rows.v[0].segments, 64); // transposed V: one run per V element (2 heads x 32)
});

shimTest("the shim refuses bad pages before touching the cache", async (shim) => {
  using pair = await HandoffPair.open("dense", {}, {});
  await prefillAndExport(pair.a, prompt(512), { chunkTokens: 256 });
  const page = await shim.exportPage(pair.a, "main", 0, 0, 256);
  await shim.importPage(pair.b, "main", 0, page);
  const before = shim.facts(pair.b, 0);
  await refusedWith(shim.importPage(pair.b, "main", 0, page), SHIM_RC.E_OVERLAP, /already staged/);
  const flipped = page.slice();
  flipped[flipped.length - 1] ^= 1;
  await refusedWith(shim.importPage(pair.b, "main", 0, flipped), SHIM_RC.E_CHECKSUM, /\[0, 256\)/);
  await refusedWith(
    shim.importPage(pair.b, "main", 0, page.subarray(0, 100)),
    SHIM_RC.E_FORMAT,
    /length/,
  );
  await refusedWith(shim.importPage(pair.b, "swa", 0, page), SHIM_RC.E_ARG, /attention cache/);
  assert.deepEqual(shim.facts(pair.b, 0), before);
});

shimTest("the shim's own layout checks name what differs", async (shim) => {
  for (
    const [over, code, pattern] of [
      [{ typeK: "f32", typeV: "f32" }, SHIM_RC.E_MISMATCH, /K type or row size of layer 0/],
      [{ flashAttention: true }, SHIM_RC.E_MISMATCH, /flash attention is on here/],
      [{ nCtx: 1024 }, SHIM_RC.E_TOO_SMALL, /1024 cells, the source had 2048/],
    ] as const
  ) {
    using pair = await HandoffPair.open("dense", {}, over);
    await prefillAndExport(pair.a, prompt(256), { chunkTokens: 256 });
    const page = await shim.exportPage(pair.a, "main", 0, 0, 256);
    await refusedWith(shim.importPage(pair.b, "main", 0, page), code, pattern);
    assert.equal(shim.facts(pair.b, 0).main.count, 0);
  }
});

shimTest("exporting positions the source does not hold is refused", async (shim) => {
  using pair = await HandoffPair.open("dense");
  await prefillAndExport(pair.a, prompt(256), { chunkTokens: 256 });
  await refusedWith(
    shim.exportPage(pair.a, "main", 0, 200, 300),
    SHIM_RC.E_SOURCE,
    /holds 56 of the 100/,
  );
  await refusedWith(
    shim.exportPage(pair.a, "swa", 0, 0, 256),
    SHIM_RC.E_KIND,
    /no sliding-window cache/,
  );
  await refusedWith(shim.exportPage(pair.a, "main", 7, 0, 256), SHIM_RC.E_ARG, /sequence id 7/);
});

shimTest("sequence facts follow the prefill", async (shim) => {
  using pair = await HandoffPair.open("iswa", { swaFull: false });
  await prefillAndExport(pair.a, prompt(700), { chunkTokens: 256 });
  const f = shim.facts(pair.a, 0);
  assert.deepEqual([f.kind, f.main.count, f.main.min, f.main.max], ["iswa", 700, 0, 699]);
  assert.equal(f.swa.max, 699);
  assert.ok(f.swa.size < f.main.size, "a ring sliding-window cache is smaller than the context");
});
