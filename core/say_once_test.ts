import assert from "node:assert/strict";
import { sayOnce } from "./say_once.ts";

Deno.test("sayOnce writes each distinct line once", () => {
  const seen: unknown[] = [];
  const original = console.error;
  console.error = (...args: unknown[]) => seen.push(args.join(" "));
  try {
    const line = `test line ${crypto.randomUUID()}`;
    assert.equal(sayOnce(line), true);
    assert.equal(sayOnce(line), false);
    assert.equal(sayOnce(`${line} (other)`), true);
    assert.deepEqual(seen, [`skippy: ${line}`, `skippy: ${line} (other)`]);
  } finally {
    console.error = original;
  }
});
