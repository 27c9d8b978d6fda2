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
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { type ExportedChunk, StateExporter } from "./exporter.ts";
import { resolveIdentity } from "./identity.ts";
import { SKIPPY_SHIM_ABI_VERSION as SHIM_ABI } from "../ffi/shim/abi.ts";

const shimOk = (await loadShim(loadLlama())).ok;

Deno.test({
  name: "layer capture: the first token is sampled before the captured layers drain",
  ignore: !shimOk,
  fn: async () => {
    const modelPath = await testModel("hybrid");
    using engine = await Engine.open({
      ...RUNTIME_DEFAULTS,
      modelPath,
      nCtx: 1024,
      chunkTokens: 128,
    });
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
