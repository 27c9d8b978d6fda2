import assert from "node:assert/strict";
import { gridCounts, gridPoints, gridSection, ISSUE_GRID, pooledNote } from "./link_matrix_grid.ts";
import type { PointSummary } from "./link_matrix_points.ts";

/** A point summary at 400 Mbit/s 2 ms lossless, super-mini 512: what gridPoints reads of it. */
function point(tail: [number, number], tailsMs: number[], spread = 0.1): PointSummary {
  return {
    key: "super-mini|400000000|2|0|512",
    model: "super-mini",
    promptTokens: 512,
    linkPoint: "400M 2ms 0%",
    repeats: tailsMs.length,
    ttft: [1000, 1000],
    tail,
    link: null,
    ready: null,
    tailSpread: spread,
    ttftSpread: 0,
    tailsMs,
  };
}

const at = (points: ReturnType<typeof gridPoints>, key: string) =>
  points.find((p) => p.key === key)!;
const KEY = "super-mini|400000000|2|0|512";

Deno.test("gridPoints() lists every point of the issue's grid, unmeasured ones as such", () => {
  const points = gridPoints([]);
  assert.equal(points.length, 126); // (4 super-mini + 3 lab-state prompts) x 3 rates x 3 RTTs x 2
  assert.equal(ISSUE_GRID.prompts["lab-state"].length, 3);
  assert.ok(points.every((p) => p.point === null && p.tailMet === null));
  const c = gridCounts(points);
  assert.deepEqual([c.points, c.measured, c.tailMet, c.misses], [126, 0, 0, 0]);
  assert.match(gridSection(points).table, /not measured/);
});

Deno.test("gridPoints() reads a point from the run with the most tails there", () => {
  const points = gridPoints([
    { file: "a.json", points: [point([100, 100], [90, 100, 110, 100])] }, // met, 4 tails
    { file: "b.json", points: [point([200, 100], [100, 100])] }, // a miss, 2 tails
  ]);
  const p = at(points, KEY);
  assert.equal(p.file, "a.json");
  assert.deepEqual(p.tiedFiles, ["a.json"]);
  assert.equal(p.tailMet, true);
  assert.equal(gridCounts(points).tailMet, 1);
  assert.match(gridSection(points).notes!.join(" "), /No point misses the tail\./);
});

Deno.test("gridPoints() on a tie: met only if every tied run meets it, the worst shown", () => {
  const met = { file: "met.json", points: [point([105, 100], [100, 100, 100])] };
  const miss = { file: "miss.json", points: [point([130, 100], [80, 100, 150])] };
  for (const runs of [[met, miss], [miss, met]]) { // the order the runs are given in is moot
    const p = at(gridPoints(runs), KEY);
    assert.equal(p.file, "miss.json");
    assert.equal(p.tiedFiles.length, 2);
    assert.equal(p.tailMet, false);
    assert.equal(p.ttftMet, true);
  }
  const c = gridCounts(gridPoints([met, miss]));
  assert.deepEqual([c.tied, c.misses, c.missesNoisy], [1, 1, 0]); // spread 10%: not noisy
});

Deno.test("gridCounts() names a miss noisy only where its own repeats spread beyond 15%", () => {
  const runs = [{ file: "n.json", points: [point([130, 100], [60, 100, 140], 0.4)] }];
  const c = gridCounts(gridPoints(runs));
  assert.deepEqual([c.measured, c.tailMet, c.misses, c.missesNoisy], [1, 0, 1, 1]);
  assert.match(gridSection(gridPoints(runs)).notes!.join(" "), /Of the 1 tail misses, 1 are/);
});

Deno.test("pooledNote() counts the points as pooled and names each tail miss with its rows", () => {
  assert.match(pooledNote([point([105, 100], [90, 100, 110])]), /at 1 of 1, TTFT at 1\.$/);
  const miss = pooledNote([point([130, 100], [80, 100, 150])]);
  assert.match(
    miss,
    /at 0 of 1, TTFT at 1; the tail misses: super-mini 512 400M 2ms 0% 30% \(n 3\)\.$/,
  );
});
