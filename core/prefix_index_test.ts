import assert from "node:assert/strict";
import { blockKeys, type PrefixEntry, PrefixIndex } from "./prefix_index.ts";

const B = 4;
const seq = (n: number, from = 0) => Int32Array.from({ length: n }, (_, i) => from + i);
const entry = (
  tenantId: string,
  tokens: Int32Array,
  bytes = 10,
  trimmable = false,
): PrefixEntry<string> => ({
  tenantId,
  tokens,
  bytes,
  value: `${tenantId}:${tokens.length}:${tokens[0]}`,
  trimmable,
});

Deno.test("prefix index: longest exact prefix at a block boundary, at least one token left", async () => {
  const index = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 1000 });
  const prompt = seq(14);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 4))), true);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 8))), true);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 12))), true);
  assert.equal((await index.lookup("a", prompt))?.cachedTokens, 12);
  // Shares 10 tokens: the deepest checkpoint at or before the shared length is 8.
  const other = prompt.slice();
  other[10] = 999;
  assert.equal((await index.lookup("a", other))?.cachedTokens, 8);
  // Exactly 12 tokens: the last one must be computed, so 8.
  assert.equal((await index.lookup("a", prompt.subarray(0, 12)))?.cachedTokens, 8);
  const diverged = prompt.slice();
  diverged[0] = 999;
  assert.equal(await index.lookup("a", diverged), null);
});

Deno.test("prefix index: a tenant's entry never matches another tenant", async () => {
  const index = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 1000 });
  await index.insert(entry("tenant-a", seq(8)));
  assert.equal(await index.lookup("tenant-b", seq(12)), null);
  assert.equal((await index.lookup("tenant-a", seq(12)))?.entry.value, "tenant-a:8:0");
  // The salt separates keys, so even the key space differs.
  const [ka] = await blockKeys("tenant-a", seq(4), B);
  const [kb] = await blockKeys("tenant-b", seq(4), B);
  assert.notEqual(ka, kb);
  // Tenant ids that concatenate alike still differ (the salt is length-prefixed).
  const [k1] = await blockKeys("ab", seq(4, 1), B);
  const [k2] = await blockKeys("a", seq(4, 1), B);
  assert.notEqual(k1, k2);
});

Deno.test("prefix index: LRU eviction by bytes, hits refresh, bounds hold", async () => {
  const evicted: string[] = [];
  const index = new PrefixIndex<string>(
    { blockTokens: B, prefixCacheBytesMax: 30 },
    (e) => evicted.push(e.value),
  );
  await index.insert(entry("a", seq(4, 100)));
  await index.insert(entry("a", seq(4, 200)));
  await index.insert(entry("a", seq(4, 300)));
  assert.equal(index.bytes, 30);
  assert.ok(await index.lookup("a", seq(5, 100)), "refreshes 100");
  await index.insert(entry("a", seq(4, 400)));
  assert.deepEqual(evicted, ["a:4:200"], "the least recently used went first");
  await index.insert(entry("a", seq(4, 500), 20));
  assert.deepEqual(evicted, ["a:4:200", "a:4:300", "a:4:100"]);
  assert.equal(index.bytes, 30);
  assert.equal(index.evictedTotal, 3);
  assert.equal(await index.insert(entry("a", seq(4, 600), 31)), false, "larger than the budget");
  assert.equal(index.bytes, 30);
  index.clear();
  assert.equal(index.bytes, 0);
  assert.equal(index.size, 0);
  assert.equal(evicted.length, 5);
});

Deno.test("prefix index: off at 0 bytes, bad options refused", async () => {
  const off = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 0 });
  assert.equal(await off.insert(entry("a", seq(4))), false);
  assert.equal(await off.lookup("a", seq(8)), null);
  assert.throws(
    () => new PrefixIndex({ blockTokens: 0, prefixCacheBytesMax: 1 }),
    /prefixBlockTokens/,
  );
  assert.throws(() => new PrefixIndex({ blockTokens: 4, prefixCacheBytesMax: -1 }), /BytesMax/);
});

Deno.test("prefix index: an entry off a block boundary (a user-turn end) hits exactly there", async () => {
  const index = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 1000 });
  const prompt = seq(14);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 4))), true);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 6))), true);
  assert.equal(await index.insert(entry("a", prompt.subarray(0, 3))), true, "under one block");
  assert.equal((await index.lookup("a", prompt))?.cachedTokens, 6);
  // Diverges at 5: the 6-token entry no longer matches; the 4-token one does.
  const other = prompt.slice();
  other[5] = 999;
  assert.equal((await index.lookup("a", other))?.cachedTokens, 4);
  other[3] = 999;
  assert.equal((await index.lookup("a", other))?.cachedTokens, 3);
  // Exactly 6 tokens: the last must be computed.
  assert.equal((await index.lookup("a", prompt.subarray(0, 6)))?.cachedTokens, 4);
  assert.equal(await index.lookup("b", prompt), null, "another tenant");
  // The same tokens again replace the entry, not add one.
  const size = index.size;
  await index.insert(entry("a", prompt.subarray(0, 6)));
  assert.equal(index.size, size);
  index.clear();
  assert.equal(index.size, 0);
  assert.equal(index.bytes, 0);
  assert.equal(await index.lookup("a", prompt), null);
});

Deno.test("prefix index: a trimmable (dense) entry serves every block boundary below its length", async () => {
  const index = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 1000 });
  const prompt = seq(14);
  await index.insert(entry("a", prompt.subarray(0, 13), 10, true));
  assert.equal((await index.lookup("a", prompt))?.cachedTokens, 13);
  const other = prompt.slice();
  other[10] = 999;
  assert.equal((await index.lookup("a", other))?.cachedTokens, 8, "cut back to a block");
  other[5] = 999;
  assert.equal((await index.lookup("a", other))?.cachedTokens, 4);
  assert.equal((await index.lookup("a", prompt.subarray(0, 13)))?.cachedTokens, 12);
  assert.equal(await index.lookup("b", prompt), null, "another tenant");
  // A non-trimmable entry of the same length serves only its whole length.
  const plain = new PrefixIndex<string>({ blockTokens: B, prefixCacheBytesMax: 1000 });
  await plain.insert(entry("a", prompt.subarray(0, 13)));
  assert.equal(await plain.lookup("a", other), null);
  // Eviction unfiles it from every block.
  index.clear();
  assert.equal(await index.lookup("a", other), null);
});
