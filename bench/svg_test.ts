import assert from "node:assert/strict";
import { barChart, lineChart } from "./svg.ts";

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
