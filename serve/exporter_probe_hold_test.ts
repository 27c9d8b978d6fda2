/**
 * The prefiller's continuation probe (one decode after the prompt) waits for the promise
 * `onTailExported` returns: the session settles it when the manifest has left, so on a machine
 * whose cores the workers share, the probe's compute does not compete with the last bytes of
 * state leaving. Real llama.cpp; the sink records what it is given.
 */
import assert from "node:assert/strict";
import { testModel, testTokens } from "../testing/models.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { DEFAULT_EXPORT_LIMITS, type ExportedChunk, StateExporter } from "./exporter.ts";
import { resolveIdentity } from "./identity.ts";
import { SKIPPY_SHIM_ABI_VERSION as SHIM_ABI } from "../ffi/shim/abi.ts";

Deno.test("the probe decode starts only once the promise onTailExported returned settles", async () => {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: await testModel("hybrid"),
    nCtx: 512,
    chunkTokens: 64,
  });
  const identity = await resolveIdentity(engine, { shimAbiVersion: SHIM_ABI });
  const exporter = new StateExporter(engine, identity, "h-probe-hold", null, {
    ...DEFAULT_EXPORT_LIMITS,
    layerCapture: false,
  });
  const kinds: string[] = [];
  const sink = (c: ExportedChunk) => {
    kinds.push(c.header.kind);
    return Promise.resolve();
  };
  const n = 100;
  const manifestLeft = Promise.withResolvers<void>();
  const tailExported = Promise.withResolvers<number>();
  let settled = false;
  const run = exporter.run(
    testTokens(n),
    { temperature: 0 },
    { seed: 0, draws: 0 },
    sink,
    undefined,
    undefined,
    () => {
      tailExported.resolve(engine.position);
      return manifestLeft.promise;
    },
  ).finally(() => settled = true);

  // Every component was handed over before the hook; the first token is the last one.
  assert.equal(await tailExported.promise, n);
  assert.equal(kinds.at(-1), "first-token");
  // Held: several event-loop turns later the probe has not decoded its token.
  for (let i = 0; i < 5; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(settled, false);
  assert.equal(engine.position, n);
  manifestLeft.resolve();
  const result = await run;
  assert.equal(engine.position, n + 1);
  assert.match(result.probeLogitsSha256, /^[0-9a-f]{64}$/);
});
