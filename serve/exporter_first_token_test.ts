/**
 * With layer capture the last chunk's captured layers are handed to a bounded sink, which
 * waits while the link is slow. The first token must not wait with them: it is sampled the
 * moment the last chunk's compute is done. Real llama.cpp and the shim; the sink is a fake
 * that holds every recurrent chunk until the first token has been sampled.
 */
import assert from "node:assert/strict";
import { loadLlama } from "../ffi/mod.ts";
import { loadShim } from "../ffi/shim/shim.ts";
import { testModel, testTokens } from "../testing/models.ts";
import { type ChunkDone, Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { DEFAULT_EXPORT_LIMITS, type ExportedChunk, StateExporter } from "./exporter.ts";
import { resolveIdentity } from "./identity.ts";
import { SKIPPY_SHIM_ABI_VERSION as SHIM_ABI } from "../ffi/shim/abi.ts";

const shimOk = (await loadShim(loadLlama())).ok;

/** The hybrid test model, prefilled in chunks of 128 tokens. */
async function hybridEngine(): Promise<Engine> {
  const modelPath = await testModel("hybrid");
  return await Engine.open({ ...RUNTIME_DEFAULTS, modelPath, nCtx: 1024, chunkTokens: 128 });
}

Deno.test({
  name: "layer capture: the first token is sampled before the captured layers drain",
  ignore: !shimOk,
  fn: async () => {
    using engine = await hybridEngine();
    const identity = await resolveIdentity(engine, { shimAbiVersion: SHIM_ABI });
    const exporter = new StateExporter(engine, identity, "h-first-token", null);
    // The decode in flight: a captured layer can only arrive during the last chunk's.
    let decoding: Promise<void> = Promise.resolve();
    const ctx = engine.ctx;
    const decode = ctx.decode.bind(ctx);
    ctx.decode = (batch) => (decoding = decode(batch));
    let sampled = false;
    const verdicts: boolean[] = [];
    const sink = async (c: ExportedChunk) => {
      if (c.header.kind !== "conv" && c.header.kind !== "ssm") return;
      if (verdicts.length > 0) return;
      // A link that takes nothing more until the chunk's compute is done, and a moment after.
      await decoding;
      await new Promise((r) => setTimeout(r, 0));
      verdicts.push(sampled);
    };
    const result = await exporter.run(
      testTokens(300),
      { temperature: 0 },
      { seed: 0, draws: 0 },
      sink,
      () => void (sampled = true),
    );
    assert.deepEqual(verdicts, [true], "first token sampled while a captured layer was held");
    assert.ok(result.firstToken >= 0);
  },
});

Deno.test({
  name: "the first-token hook hears the last chunk's tokens and compute: full with capture",
  ignore: !shimOk,
  fn: async () => {
    using engine = await hybridEngine();
    const identity = await resolveIdentity(engine, { shimAbiVersion: SHIM_ABI });
    // 300 tokens in chunks of 128: with layer capture the 44 left over go first and the last
    // chunk, which the capture hides behind, is a full one; without it they go last.
    for (const layerCapture of [true, false]) {
      await engine.wipe();
      const exporter = new StateExporter(engine, identity, `h-last-chunk-${layerCapture}`, null, {
        ...DEFAULT_EXPORT_LIMITS,
        layerCapture,
      });
      let heard: ChunkDone | undefined;
      const t0 = performance.now();
      await exporter.run(
        testTokens(300),
        { temperature: 0 },
        { seed: 0, draws: 0 },
        () => Promise.resolve(),
        (_token, _logits, _at, lastChunk) => void (heard = lastChunk),
      );
      const elapsedMs = performance.now() - t0;
      assert.ok(heard, `capture ${layerCapture}: no last chunk timing`);
      assert.equal(heard.p1 - heard.p0, layerCapture ? 128 : 44, `capture ${layerCapture}`);
      assert.ok(heard.computeMs > 0 && heard.computeMs < elapsedMs, `capture ${layerCapture}`);
    }
  },
});
