import assert from "node:assert/strict";
import { FAULT_POINTS, faultPoint, parseFaultSpec } from "./fault_points.ts";

Deno.test("a fault spec names a known point and a count from 1; anything else is refused", () => {
  assert.deepEqual(parseFaultSpec("token-batch-sent:3"), { point: "token-batch-sent", n: 3 });
  for (const point of FAULT_POINTS) assert.equal(parseFaultSpec(`${point}:1`)?.point, point);
  for (const bad of ["token-batch-sent", "token-batch-sent:0", "nowhere:1", "x:1:2", ""]) {
    assert.equal(parseFaultSpec(bad), null, bad);
  }
});

Deno.test("unarmed (no SKIPPY_FAULT_KILL in this process), every point is a no-op", () => {
  for (const point of FAULT_POINTS) faultPoint(point); // this process is still alive
});
