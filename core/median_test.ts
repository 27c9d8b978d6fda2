import assert from "node:assert/strict";
import { median } from "./median.ts";

Deno.test("median() takes the middle value, or the mean of the two middle ones", () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.equal(median([-5]), -5);
  assert.ok(Number.isNaN(median([])));
  const xs = [2, 1];
  median(xs);
  assert.deepEqual(xs, [2, 1], "the input is not reordered");
});
