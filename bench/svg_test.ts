import assert from "node:assert/strict";
import { barChart, lineChart, scatterChart } from "./svg.ts";

Deno.test("lineChart() draws one polyline per series and escapes labels", () => {
  const svg = lineChart([
    { name: "export <page>", points: [{ x: 1024, y: 10 }, { x: 8192, y: 11 }] },
    { name: "import", points: [{ x: 1024, y: 30 }, { x: 8192, y: 33 }] },
  ], { title: "t", xLabel: "context", yLabel: "us", logX: true });
  assert.equal(svg.match(/<polyline/g)?.length, 2);
  assert.ok(svg.includes("export &lt;page&gt;"));
  assert.ok(svg.startsWith("<svg"));
});

Deno.test("barChart() draws categories x series bars", () => {
  const svg = barChart(["dense", "hybrid"], [
    { name: "prefill", values: [100, 200] },
    { name: "decode", values: [10, 20] },
  ], { title: "t", xLabel: "family", yLabel: "tok/s" });
  assert.equal(svg.match(/<title>/g)?.length, 4);
  assert.ok(svg.includes("<title>decode: 20</title>"));
});

Deno.test("scatterChart() draws a whisker for a point's measured range, and none without one", () => {
  const svg = scatterChart([{
    name: "tail",
    points: [{ x: 20, y: 25, yLow: 15, yHigh: 40 }, { x: 100, y: 90 }],
  }], { title: "t", xLabel: "predicted", yLabel: "measured" });
  assert.equal(svg.match(/<circle/g)?.length, 2);
  // The y = x line plus one whisker, which spans 15..40 on the point's x.
  const lines = [...svg.matchAll(/<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"/g)];
  const whiskers = lines.filter((m) => m[1] === m[3]);
  assert.equal(whiskers.length, 1);
  assert.ok(Number(whiskers[0][2]) > Number(whiskers[0][4]), "low end drawn below the high end");
});
