import assert from "node:assert/strict";
import { CongestionChoice } from "./congestion_choice.ts";

Deno.test("CongestionChoice: a fixed controller stays whatever the probes find", () => {
  for (const mode of ["cubic", "bbr"] as const) {
    const c = new CongestionChoice(mode, 0.0002);
    assert.equal(c.for("d"), mode);
    assert.equal(c.afterProbe("d", 10_000, 50), null);
    assert.equal(c.afterProbe("d", 10_000, 0), null);
    assert.equal(c.for("d"), mode);
  }
});

Deno.test("CongestionChoice: auto goes BBR on a link whose probe finds loss, and back when one finds none", () => {
  const c = new CongestionChoice("auto", 0.0002);
  assert.equal(c.for("d"), "cubic", "before any probe");
  assert.equal(c.afterProbe("d", 10_000, 0), null, "clean: stays Cubic");
  assert.equal(c.afterProbe("d", 10_000, 1), null, "one event in 10,000: under the bound");
  assert.equal(c.afterProbe("d", 10_000, 2), "bbr", "at the bound");
  assert.equal(c.for("d"), "bbr");
  assert.equal(c.for("other"), "cubic", "per link");
  assert.equal(c.afterProbe("d", 10_000, 9), null, "still lossy: no change");
  assert.equal(c.afterProbe("d", 10_000, 0), "cubic");
  assert.equal(c.for("d"), "cubic");
  assert.equal(c.afterProbe("d", 0, 0), null, "an empty probe says nothing");
});
