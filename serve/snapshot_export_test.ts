/**
 * The snapshot exported after prefill (no layer capture) with chunks smaller than one layer:
 * every conv and SSM layer of the tiny hybrid is a run of its own, cut into byte pieces no
 * larger than the chunk, each exported as its own window; layer ranges tile the trunk and the
 * pieces of each run tile it. Imported piece by piece, they leave the decoder byte-identical
 * to the prefiller and continuing bitwise-exactly. Real llama.cpp and the shim.
 */
import assert from "node:assert/strict";
import type { ChunkHeader } from "../core/mod.ts";
import { LlamaContext, LlamaModel, loadLlama } from "../ffi/mod.ts";
import { loadShim } from "../ffi/shim/shim.ts";
import { greedyLogits, prefillAndExport } from "../ffi/state_driver.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import { readGgufFile, specFromGguf } from "../models/mod.ts";
import { testModel, testTokens } from "../testing/models.ts";
import { exportSnapshot } from "./_snapshot_export.ts";
import type { ExportedChunk } from "./exporter.ts";

const N = 300;
const CHUNK_BYTES = 1024;
const CONTEXT = { nCtx: 1024, nBatch: 256, threads: 2, flashAttention: false } as const;
const lib = loadLlama();
const shimOk = (await loadShim(lib)).ok;

Deno.test({
  name: "hybrid: a snapshot cut into 1 KiB pieces of each layer imports piece by piece, exactly",
  ignore: !shimOk,
  fn: async () => {
    const path = await testModel("hybrid");
    const layerKinds = specFromGguf(await readGgufFile(path), path).layers.map((k) =>
      k === "mamba" ? "recurrent" : k
    );
    using ma = await LlamaModel.load(lib, path);
    using mb = await LlamaModel.load(lib, path);
    using a = await LlamaContext.create(ma, { ...CONTEXT, typeK: "f16", typeV: "f16" });
    using b = await LlamaContext.create(mb, { ...CONTEXT, typeK: "f16", typeV: "f16" });
    const state = await prefillAndExport(a, testTokens(N), { chunkTokens: 128 });
    const chunks: ExportedChunk[] = [];
    await exportSnapshot({
      ctx: a,
      layerKinds,
      limits: { chunkBytesMax: CHUNK_BYTES, snapshotChunkBytes: 4 << 20 },
      captured: new Set(),
      sink: (c) => Promise.resolve(void chunks.push(c)),
      chunk: (part, layerRange, payload, piece) => ({
        header: { kind: part, layerRange, payloadBytes: payload.byteLength, piece } as ChunkHeader,
        payload,
      }),
    });
    const recurrent = layerKinds.flatMap((k, i) => (k === "recurrent" ? [i] : []));
    for (const part of ["conv", "ssm"] as const) {
      const mine = chunks.filter((c) => c.header.kind === part).map((c) => c.header);
      // One run per recurrent layer (each is over 1 KiB), tiling the trunk.
      const runs = [...new Map(mine.map((h) => [h.layerRange.join(), h.layerRange])).values()];
      assert.equal(runs.length, recurrent.length, part);
      assert.deepEqual(runs.map((r) => r[0]), [0, ...recurrent.slice(1)], part);
      assert.equal(runs.at(-1)![1], layerKinds.length, part);
      for (const run of runs) {
        const pieces = mine.filter((h) => h.layerRange.join() === run.join());
        assert.ok(pieces.length > 1, `${part} ${run}: cut into pieces`);
        let at = 0;
        for (const h of pieces) {
          assert.ok(h.piece && h.piece.range[0] === at && h.payloadBytes <= CHUNK_BYTES);
          at = h.piece.range[1];
        }
        assert.equal(at, pieces[0].piece!.of, `${part} ${run}: pieces tile the run`);
      }
    }
    const imp = await StagedImport.open(b, { nTokens: N });
    for (const page of state.pages) await imp.addPage(page);
    const before = (l: number) => recurrent.filter((i) => i < l).length;
    for (const { header: h, payload } of chunks) {
      const piece = { offset: h.piece!.range[0], of: h.piece!.of };
      const [r0, r1] = [before(h.layerRange[0]), before(h.layerRange[1])];
      await imp.addRecurrentLayers(h.kind as "conv" | "ssm", r0, r1, payload, piece);
    }
    await imp.commit();
    assert.deepEqual(await b.stateSeqGet(0, 0), await a.stateSeqGet(0, 0));
    const want = await greedyLogits(a, 7, N, 3);
    const got = await greedyLogits(b, 7, N, 3);
    for (let k = 0; k < want.length; k++) {
      assert.deepEqual(new Uint8Array(got[k].buffer), new Uint8Array(want[k].buffer), `step ${k}`);
    }
  },
});
