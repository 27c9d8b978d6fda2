import assert from "node:assert/strict";
import { LimitExceededError, UsageError } from "./errors.ts";
import { SuffixProposer } from "./suffix.ts";

Deno.test("propose() continues the earlier occurrence of the current suffix", () => {
  const p = new SuffixProposer([5, 6, 7, 8, 9, 5, 6]);
  assert.deepEqual(p.propose(3), [7, 8, 9]);
  assert.deepEqual(p.propose(1), [7]);
  assert.deepEqual(p.propose(0), []);
});

Deno.test("propose() prefers the longest match over the most recent one", () => {
  // Suffix "1 2 3": "2 3" occurs recently (followed by 9), "1 2 3" earlier (followed by 4).
  const p = new SuffixProposer([1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3]);
  assert.deepEqual(p.propose(1), [4]);
});

Deno.test("propose() breaks ties towards the most recent occurrence", () => {
  const p = new SuffixProposer([7, 8, 1, 7, 8, 2, 7, 8]);
  assert.deepEqual(p.propose(1), [2]);
});

Deno.test("propose() returns nothing without a match of ngramMin tokens", () => {
  assert.deepEqual(new SuffixProposer([1, 2, 3, 4]).propose(4), []);
  assert.deepEqual(new SuffixProposer([1]).propose(4), []);
  assert.deepEqual(new SuffixProposer([1, 2, 9, 2], { ngramMin: 2 }).propose(2), []);
  assert.deepEqual(new SuffixProposer([1, 2, 9, 2], { ngramMin: 1 }).propose(2), [9, 2]);
});

Deno.test("propose() never runs past the committed history", () => {
  const p = new SuffixProposer([4, 4, 4]);
  assert.deepEqual(p.propose(8), [4]);
});

Deno.test("append() extends the history and the index with committed tokens", () => {
  const p = new SuffixProposer([10, 11, 12]);
  assert.deepEqual(p.propose(2), []);
  p.append([13, 10, 11]);
  assert.equal(p.length, 6);
  assert.deepEqual(p.propose(2), [12, 13]);
});

Deno.test("the proposer is bounded: history, index keys, positions per key and draft length", () => {
  assert.throws(() => new SuffixProposer([1, 2, 3], { historyTokensMax: 2 }), LimitExceededError);
  const p = new SuffixProposer([], { indexKeysMax: 3, historyTokensMax: 100 });
  p.append(Array.from({ length: 50 }, (_, i) => i));
  assert.equal(p.indexKeys, 3);
  assert.throws(() => p.propose(17), UsageError);
  assert.throws(() => new SuffixProposer([], { ngramMin: 5, ngramMax: 2 }), UsageError);
  // Only the positionsPerKeyMax most recent occurrences are candidates.
  const q = new SuffixProposer([1, 2, 50, 1, 2, 60, 1, 2, 70, 1, 2], { positionsPerKeyMax: 2 });
  assert.deepEqual(q.propose(1), [70]);
});

// The obvious O(n^2) definition the index must agree with.
function naive(h: number[], k: number, min: number, max: number): number[] {
  let best = -1;
  let bestLength = 0;
  for (let e = h.length - 1; e >= min; e--) {
    let m = 0;
    while (m < max && e - m - 1 >= 0 && h[e - m - 1] === h[h.length - m - 1]) m++;
    if (m >= min && m > bestLength) {
      best = e;
      bestLength = m;
    }
  }
  return best < 0 ? [] : h.slice(best, Math.min(best + k, h.length));
}

Deno.test("propose() agrees with a naive longest-suffix search on random histories", () => {
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let trial = 0; trial < 300; trial++) {
    const length = 1 + Math.floor(random() * 120);
    const alphabet = 2 + Math.floor(random() * 5);
    const h = Array.from({ length }, () => Math.floor(random() * alphabet));
    const p = new SuffixProposer(h, { positionsPerKeyMax: 1000 });
    const k = Math.floor(random() * 8);
    assert.deepEqual(p.propose(k), naive(h, k, 2, 8), JSON.stringify({ h, k }));
  }
});
