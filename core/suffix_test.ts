import assert from "node:assert/strict";
import { LimitExceededError, UsageError } from "./errors.ts";
import { SuffixProposer } from "./suffix.ts";

Deno.test("propose() continues the earlier occurrence of the current suffix", () => {
  // Suffix "5 6 7 8" matched 4 tokens long (ngramMin 3): at most 2 tokens proposed.
  const p = new SuffixProposer([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8]);
  assert.deepEqual(p.propose(3), [9, 1]);
  assert.deepEqual(p.propose(1), [9]);
  assert.deepEqual(p.propose(0), []);
});

Deno.test("the draft length grows with the match length, up to the cap", () => {
  const cycle = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20];
  const short = new SuffixProposer([...cycle, 11, 12, 13]); // match of 3
  assert.deepEqual(short.propose(8), [14]);
  const long = new SuffixProposer([...cycle, ...cycle]); // match of 10 (the cycle)
  assert.deepEqual(long.propose(8), cycle.slice(0, 8));
  assert.deepEqual(long.propose(4), cycle.slice(0, 4));
});

Deno.test("propose() prefers the longest match over the most recent one", () => {
  // Suffix "0 1 2 3": "1 2 3" occurs recently (followed by 9), "0 1 2 3" earlier (then 4).
  const p = new SuffixProposer([0, 1, 2, 3, 4, 7, 1, 2, 3, 9, 0, 1, 2, 3]);
  assert.deepEqual(p.propose(1), [4]);
});

Deno.test("propose() breaks ties towards the most recent occurrence", () => {
  const p = new SuffixProposer([7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 9]);
  assert.deepEqual(p.propose(1), [2]);
});

Deno.test("propose() is silent below ngramMin", () => {
  assert.deepEqual(new SuffixProposer([1, 2, 3, 4]).propose(4), []);
  assert.deepEqual(new SuffixProposer([1]).propose(4), []);
  // "9 2" repeats (2 tokens) but ngramMin is 3.
  assert.deepEqual(new SuffixProposer([9, 2, 5, 1, 9, 2]).propose(2), []);
  assert.deepEqual(new SuffixProposer([1, 9, 2, 5, 1, 9, 2], { ngramMin: 3 }).propose(2), [5]);
});

Deno.test("ngramMin and ngramMax must lie in 3..64 with min <= max", () => {
  for (const bad of [{ ngramMin: 2 }, { ngramMin: 5, ngramMax: 4 }, { ngramMax: 65 }]) {
    assert.throws(() => new SuffixProposer([], bad), UsageError, JSON.stringify(bad));
  }
  new SuffixProposer([], { ngramMin: 64, ngramMax: 64 });
  new SuffixProposer([], { ngramMin: 3, ngramMax: 3 });
});

Deno.test("propose() never runs past the committed history", () => {
  const p = new SuffixProposer([4, 4, 4, 4, 4]);
  assert.deepEqual(p.propose(8), [4]);
});

Deno.test("append() extends the history and the index with committed tokens", () => {
  const p = new SuffixProposer([10, 11, 12, 13]);
  assert.deepEqual(p.propose(2), []);
  p.append([14, 10, 11, 12, 13]);
  assert.equal(p.length, 9);
  assert.deepEqual(p.propose(2), [14, 10]);
});

Deno.test("propose() with pending tokens matches past them and copies committed tokens only", () => {
  const p = new SuffixProposer([1, 2, 3, 4, 5, 6, 9, 1, 2]);
  assert.deepEqual(p.propose(4), []); // "9 1 2" never occurred
  // With an uncommitted "3 4" after the history, the suffix "1 2 3 4" matches 4 tokens.
  assert.deepEqual(p.propose(4, [3, 4]), [5, 6]);
  assert.equal(p.length, 9, "pending tokens are not committed");
});

Deno.test("the proposer is bounded: history, index keys, positions per key and draft length", () => {
  assert.throws(() => new SuffixProposer([1, 2, 3], { historyTokensMax: 2 }), LimitExceededError);
  const p = new SuffixProposer([], { indexKeysMax: 3, historyTokensMax: 100 });
  p.append(Array.from({ length: 50 }, (_, i) => i));
  assert.equal(p.indexKeys, 3);
  assert.throws(() => p.propose(17), UsageError);
  // Only the positionsPerKeyMax most recent occurrences are candidates.
  const q = new SuffixProposer([1, 2, 3, 50, 1, 2, 3, 60, 1, 2, 3, 70, 1, 2, 3], {
    positionsPerKeyMax: 2,
  });
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
  if (best < 0) return [];
  return h.slice(best, Math.min(best + Math.min(k, bestLength - min + 1), h.length));
}

Deno.test("propose() agrees with a naive longest-suffix search on random histories", () => {
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let trial = 0; trial < 300; trial++) {
    const length = 1 + Math.floor(random() * 120);
    const alphabet = 2 + Math.floor(random() * 4);
    const h = Array.from({ length }, () => Math.floor(random() * alphabet));
    const p = new SuffixProposer(h, { positionsPerKeyMax: 1000, ngramMax: 8 });
    const k = Math.floor(random() * 8);
    assert.deepEqual(p.propose(k), naive(h, k, 3, 8), JSON.stringify({ h, k }));
  }
});
