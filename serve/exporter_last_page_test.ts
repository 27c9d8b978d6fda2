/**
 * With layer capture the last chunk's KV page leaves while that chunk still computes: the shim
 * exports it when the last attention layer has written its rows. It must be sent once, tile
 * the prompt with the other pages, and equal the page exported from the context afterwards.
 * Real llama.cpp and the shim; the sink records what it is given.
 */
import assert from "node:assert/strict";
import { exportKvPage, loadLlama } from "../ffi/mod.ts";
import { loadShim } from "../ffi/shim/shim.ts";
import { testModel, testTokens } from "../testing/models.ts";
import { Engine, RUNTIME_DEFAULTS } from "./engine.ts";
import { DEFAULT_EXPORT_LIMITS, type ExportedChunk, StateExporter } from "./exporter.ts";
import { resolveIdentity } from "./identity.ts";
import { SKIPPY_SHIM_ABI_VERSION as SHIM_ABI } from "../ffi/shim/abi.ts";

const shimOk = (await loadShim(loadLlama())).ok;

for (const layerCapture of [true, false]) {
  Deno.test({
    name: `hybrid, layer capture ${
      layerCapture ? "on: the last page leaves with the captured layers" : "off: after prefill"
    }; every page once, equal to the context's`,
    ignore: !shimOk,
    fn: async () => {
      using engine = await Engine.open({
        ...RUNTIME_DEFAULTS,
        modelPath: await testModel("hybrid"),
        nCtx: 1024,
        chunkTokens: 128,
      });
      const identity = await resolveIdentity(engine, { shimAbiVersion: SHIM_ABI });
      const limits = { ...DEFAULT_EXPORT_LIMITS, layerCapture };
      const exporter = new StateExporter(engine, identity, "h-last-page", null, limits);
      const pages: ExportedChunk[] = [];
      const kinds: string[] = [];
      const sink = (c: ExportedChunk) => {
        kinds.push(c.header.kind);
        if (c.header.kind === "kv-page") pages.push({ ...c, payload: c.payload.slice() });
        return Promise.resolve();
      };
      const n = 300;
      const result = await exporter.run(
        testTokens(n),
        { temperature: 0 },
        { seed: 0, draws: 0 },
        sink,
      );

      assert.equal(result.lastPageCaptured, layerCapture);
      // With the capture's hook the remainder goes first, so the last chunk is a full one.
      const p0 = layerCapture ? 172 : 256;
      const ranges = layerCapture ? [[0, 44], [44, 172]] : [[0, 128], [128, 256]];
      assert.deepEqual(pages.map((p) => p.header.tokenRange), [...ranges, [p0, n]]);
      // Exported again now that the probe decode has run: positions < n are unchanged.
      const last = await exportKvPage(engine.ctx, p0, n);
      assert.deepEqual(pages[2].payload, last);
      // Captured, it went out before the components known only after compute.
      const at = kinds.lastIndexOf("kv-page");
      const firstLate = kinds.indexOf("sampler");
      assert.ok(at < firstLate, `last page at ${at}, sampler at ${firstLate}`);
      // Positions and history are final before prefill: they lead, not in the tail.
      assert.deepEqual(kinds.slice(0, 2), ["positions", "history"]);
      if (layerCapture) assert.ok(kinds.slice(0, at).includes("ssm"), "captured layers first");
    },
  });
}
