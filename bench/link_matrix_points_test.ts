import assert from "node:assert/strict";
import type { Replayed } from "./link_matrix_report.ts";
import { byPoint, tailAgainstNoise, tailSplitHalves } from "./link_matrix_points.ts";
import type { MatrixRow } from "./link_matrix.ts";

/** A replayed row at one link point: only the fields byPoint reads are meaningful. */
function row(
  rttMs: number,
  rep: number,
  tail: [number, number] | null,
  ttft: [number, number] = [100, 100],
): Replayed {
  return {
    row: {
      model: "super-mini",
      promptTokens: 512,
      rateBitsPerS: 400e6,
      rttMs,
      lossFraction: 0,
      rep,
    } as MatrixRow,
    ttft,
    tail,
    link: tail ? [tail[0] / 2, tail[1] / 2] : null,
    ready: tail ? [ttft[0] + tail[0], ttft[1] + tail[1]] : null,
    probe: null,
    bandwidthFrom: rep === 0 ? "probe" : "handoff",
  };
}

Deno.test("byPoint() takes medians over each point's repeats, not across points", () => {
  const points = byPoint([
    row(2, 0, [50, 40]),
    row(10, 0, [90, 100]),
    row(2, 1, [52, 60]),
    row(10, 1, [92, 110]),
    row(2, 2, [54, 50]),
    row(10, 2, [94, 400]), // one loss stall at 10 ms
  ]);
  assert.equal(points.length, 2);
  const [near, far] = points;
  assert.equal(near.linkPoint, "400M 2ms 0%");
  assert.equal(near.repeats, 3);
  assert.deepEqual(near.tail, [52, 50]);
  assert.deepEqual(near.link, [26, 25]);
  assert.deepEqual(near.ready, [152, 150]); // its own medians, not the medians' sum by chance
  assert.deepEqual(far.ready, [192, 210]);
  assert.deepEqual(near.tailsMs, [40, 60, 50]);
  assert.ok(Math.abs(near.tailSpread! - 0.2) < 1e-12); // 40 and 60 around a median of 50
  // The stall moves the spread, not the median.
  assert.deepEqual(far.tail, [92, 110]);
  assert.ok(Math.abs(far.tailSpread! - (400 / 110 - 1)) < 1e-12);
  assert.equal(far.ttftSpread, 0);
});

Deno.test("byPoint() leaves a point's spread null below two measurements", () => {
  const [p] = byPoint([row(2, 0, [50, 40]), row(2, 1, null)]);
  assert.equal(p.repeats, 2);
  assert.deepEqual(p.tail, [50, 40]);
  assert.equal(p.tailSpread, null);
  assert.deepEqual(p.tailsMs, [40]);
});

Deno.test("tailAgainstNoise() splits the misses by whether the point's own repeats agree", () => {
  const points = byPoint([
    row(0.2, 0, [50, 48]), // steady (48, 52), met
    row(0.2, 1, [50, 52]),
    row(2, 0, [80, 50]), // steady (50, 52), missed: a model error
    row(2, 1, [80, 52]),
    row(10, 0, [100, 60]), // repeats 60 and 140 around 100: noisy, met by the median
    row(10, 1, [100, 140]),
  ]);
  points.push(...byPoint([
    { ...row(10, 0, [300, 100]), row: { ...row(10, 0, null).row, promptTokens: 2048 } },
    { ...row(10, 1, [300, 200]), row: { ...row(10, 1, null).row, promptTokens: 2048 } },
    { ...row(10, 2, [300, 150]), row: { ...row(10, 2, null).row, promptTokens: 2048 } },
  ]));
  points.push(...byPoint([{ ...row(2, 0, [10, 90]), row: { ...row(2, 0, null).row, rttMs: 5 } }]));
  assert.deepEqual(tailAgainstNoise(points), {
    points: 4, // the one-repeat point has no spread and is left out
    met: 2,
    steady: 2,
    steadyMet: 1,
    missedNoisy: 1, // 300 against a median of 150 whose repeats span 100-200
  });
  // At 50% every point's repeats agree, and both misses are the model's.
  assert.deepEqual(tailAgainstNoise(points, 0.5), {
    points: 4,
    met: 2,
    steady: 4,
    steadyMet: 2,
    missedNoisy: 0,
  });
});

Deno.test("tailSplitHalves() sets the odd repeats' median beside the even ones'", () => {
  const at = (rttMs: number, tails: [number, number][]) =>
    byPoint(tails.map((t, rep) => row(rttMs, rep, t)));
  const points = [
    // Odd repeats 100, 104 (median 102), even 98, 101 (99.5): the halves agree; the
    // prediction 110 meets both and the median of all (100.5).
    ...at(0.2, [[110, 100], [110, 98], [110, 104], [110, 101]]),
    // Odd 50, 52, 54 (52), even 90, 94 (92): the halves disagree. The prediction 88 meets the
    // even half only, and misses the median of all (54).
    ...at(2, [[88, 50], [88, 90], [88, 52], [88, 94], [88, 54]]),
    // Three tails: too few to split, left out.
    ...at(10, [[10, 10], [10, 10], [10, 10]]),
  ];
  assert.deepEqual(tailSplitHalves(points), {
    points: 2,
    halvesAgree: 1,
    predictionMeetsHalf: 3,
    predictionMeets: 1,
  });
  // At 80% the second point's halves (52 against 92) agree too.
  assert.equal(tailSplitHalves(points, 0.8).halvesAgree, 2);
});
