import assert from "node:assert/strict";
import { parseCalibration } from "../core/node_rates.ts";
import { testModel } from "../testing/models.ts";
import { calibrate, writeCalibration } from "./calibrate.ts";

Deno.test("calibrate() measures rates at each depth and writeCalibration() keeps one entry per node", async () => {
  const model = await testModel("dense");
  const node = await calibrate({ modelPath: model, nodeId: "n1", depths: [32, 64] });
  assert.equal(node.prefill.length, 2);
  assert.equal(node.decode.length, 2);
  for (const p of [...node.prefill, ...node.decode]) assert.ok(p.tokensPerS > 0);
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/cal.json`;
    await writeCalibration(path, node);
    await writeCalibration(path, { ...node, nodeId: "n2" });
    await writeCalibration(path, node);
    const nodes = parseCalibration(JSON.parse(await Deno.readTextFile(path)));
    assert.deepEqual(nodes.map((n) => n.nodeId).sort(), ["n1", "n2"]);
    assert.deepEqual(nodes.find((n) => n.nodeId === "n1")!.prefill, node.prefill);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
