import { assertEquals } from "../testing/assert.ts";
import { FUZZ_TARGETS, runFuzz } from "./fuzz.ts";

Deno.test("every fuzzed frame, message, chunk header, manifest and handoff event parses or fails typed", () => {
  // 1000 seeded cases per target (about a second); `bench/fuzz.ts --iterations N` runs more.
  const results = runFuzz({ seed: 20261, iterations: 1000 });
  assertEquals(results.map((r) => r.target), [...FUZZ_TARGETS]);
  for (const r of results) {
    assertEquals(r.finding, null, `${r.target}: ${r.finding?.error}`);
    assertEquals(r.iterations, 1000);
  }
});
