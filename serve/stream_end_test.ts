/**
 * The end of a prefiller's handoff stream per attempt (`StreamEnd`): the manifest is sealed
 * once, the probe digest only after it, a retry signs both again, and the probe decode's wait
 * settles when the manifest has left. Pure bookkeeping over core's tag functions.
 */
import assert from "node:assert/strict";
import { type BindingContext, buildManifest, newBindingKey, openManifest } from "../core/mod.ts";
import { StreamEnd } from "./_stream_end.ts";

const HANDOFF_ID = "h-stream-end";
// Sealing never reads the component list: one entry stands for the stream.
const unsigned = buildManifest({
  handoffId: HANDOFF_ID,
  identityDigest: "ab".repeat(32),
  family: "hybrid",
  components: [{
    kind: "history",
    layerRange: [0, 0],
    tokenRange: [0, 256],
    bytes: 1024,
    checksum: "0badc0de",
  }],
  logical: { position: 256, tokenCount: 256 },
});
const binding = (): BindingContext => ({
  bindingKey: newBindingKey(),
  handoffId: HANDOFF_ID,
  destNodeId: "node-d",
  tenantId: "tenant-a",
});

Deno.test("StreamEnd: the manifest once per attempt, its digest after it, both again after a retry", async () => {
  const end = new StreamEnd();
  const first = binding();
  assert.equal(await end.manifest(first), null, "nothing before the exporter's tail");
  let held = true;
  const wait = end.tailExported(unsigned).then(() => held = false);
  end.probeDone("cd".repeat(32));
  assert.equal(await end.probe(first), null, "no digest before its manifest");

  const manifest = await end.manifest(first);
  assert.ok(manifest);
  assert.equal(await end.manifest(first), null, "sealed once");
  assert.notEqual(await openManifest(end.payload(manifest), manifest.tag, first), null);
  assert.throws(() => end.payload({ ...manifest }), /not sealed here/);
  const probe = await end.probe(first, (d) => d.toUpperCase());
  assert.equal(probe?.logitsSha256, "CD".repeat(32));
  assert.equal(await end.probe(first), null, "signed once");

  await Promise.resolve();
  assert.equal(held, true, "the probe decode waits until the manifest has left");
  end.manifestLeft();
  await wait;
  assert.equal(held, false);

  // A retry: a new reservation's key signs both again; the old bytes do not open under it.
  end.restart();
  const second = binding();
  const again = await end.manifest(second);
  assert.ok(again);
  assert.notEqual(await openManifest(end.payload(again), again.tag, second), null);
  assert.equal(await openManifest(end.payload(again), manifest.tag, second), null);
  assert.ok(await end.probe(second));
});
