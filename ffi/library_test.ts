import assert from "node:assert/strict";
import { RuntimeLibraryError } from "../core/errors.ts";
import { readBinaryId } from "./_binary_id.ts";
import { checkBuild, loadLlama } from "./library.ts";
import {
  EXPECTED_STRUCT_SIZES,
  llama_batch,
  llama_context_params,
  llama_model_params,
} from "./llama.ts";
import { platformFor } from "./platform.ts";

Deno.test("struct layouts computed from the header match the sizes llama.cpp uses", () => {
  assert.equal(llama_model_params.size, EXPECTED_STRUCT_SIZES.llama_model_params);
  assert.equal(llama_context_params.size, EXPECTED_STRUCT_SIZES.llama_context_params);
  assert.equal(llama_batch.size, EXPECTED_STRUCT_SIZES.llama_batch);
  assert.equal(llama_context_params.offsets.cb_eval, 88);
  assert.equal(llama_context_params.offsets.ctx_other, 152);
});

Deno.test("loadLlama() opens the pinned build and picks a usable CPU variant", () => {
  const lib = loadLlama();
  assert.equal(lib.release, "v0.4.0");
  assert.match(lib.cpuVariant, /^[a-z0-9_.]+$/);
  const defaults = lib.symbols.llama_context_default_params();
  assert.equal(defaults.byteLength, EXPECTED_STRUCT_SIZES.llama_context_params);
  // The header's documented default for n_threads is 4 (we always override it).
  assert.equal(llama_context_params.get(defaults, "n_threads"), 4);
});

Deno.test("the build id read from the installed libllama is the pinned one", () => {
  const lib = loadLlama();
  const bytes = Deno.readFileSync(`${lib.libDir}/${lib.platform.llamaFile}`);
  assert.equal(readBinaryId(bytes), platformFor(Deno.build.os, Deno.build.arch)!.buildId);
  assert.equal(readBinaryId(new TextEncoder().encode("not a library".repeat(10))), null);
});

Deno.test("checkBuild() refuses a library of another build and says what it found", () => {
  const lib = loadLlama();
  const dir = Deno.makeTempDirSync();
  try {
    // Another ELF file under libllama's name: right format, wrong build.
    Deno.copyFileSync(
      `${lib.libDir}/${lib.platform.ggmlBaseFile}`,
      `${dir}/${lib.platform.llamaFile}`,
    );
    assert.throws(() => checkBuild(lib.platform, dir), (e: Error) => {
      assert.ok(e instanceof RuntimeLibraryError);
      assert.match(e.message, /not the llama.cpp build these bindings were written for/);
      assert.match(e.message, new RegExp(`expected "${lib.platform.buildId}"`));
      return true;
    });
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("loadLlama() refuses a CPU variant other than the one already loaded", () => {
  const lib = loadLlama();
  const other = lib.cpuVariant === "x64" ? "sse42" : "x64";
  assert.throws(() => loadLlama({ cpuVariant: other }), RuntimeLibraryError);
});
