/**
 * `state inspect` against the sizes a model's dimensions imply (models/state_sizes.ts), with
 * llama.cpp's framing spelled out byte for byte: exact equalities, no tolerances.
 */
import assert from "node:assert/strict";
import { expectedStateBytes, familySpec } from "../models/mod.ts";
import { SHIM_PAGE } from "../ffi/shim/abi.ts";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

/** Per page: header, one source cell range, the rows preamble (v_trans, n_layer). */
const PAGE_FIXED_BYTES = SHIM_PAGE.HEADER_BYTES + 8 + 8;
/** Per attention layer and page: llama.cpp's {type, row size} header for K and for V. */
const PAGE_LAYER_BYTES = 2 * 12;
/** Per cell: llama.cpp's metadata {pos, n_seq_id = 1, seq_id}. */
const CELL_META_BYTES = 12;
/** Per recurrent layer, for conv and for SSM alike: {type, row size}. */
const RECURRENT_LAYER_BYTES = 12;
/** Recurrent snapshot framing: magic, seq id, cell count, one cell {pos, n_seq_id = 0}, s_trans, n_layer. */
const RECURRENT_HEAD_BYTES = 4 + 4 + 4 + 8 + 4 + 4;

async function inspect(args: string[]) {
  const r = await runCliProcess(["state", "inspect", ...args, "--json"]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

// 1K rather than 32K: the super-mini hybrid prefills 8K in ~25 s on 2 cores, 32K in ~2 min.
// The sizes are per token and per page, so the formulas are the same at any length; 1K in
// chunks of 256 still gives four pages. Longer runs:
// `state inspect --model <super-mini> --prompt-tokens 32768`.
const N = 1024;
const CHUNK = 256;

Deno.test("state inspect on the super-mini hybrid reports component sizes equal to its dimensions", async () => {
  const spec = familySpec("hybrid", "super-mini");
  const s = expectedStateBytes(spec, "f16");
  const report = await inspect([
    "--model",
    await testModel("hybrid", "super-mini"),
    "--prompt-tokens",
    String(N),
    "--chunk-tokens",
    String(CHUNK),
    "--ctx",
    String(N + 256),
  ]);
  const pages = N / CHUNK;
  assert.equal(report.memory, "hybrid");
  assert.equal(report.path, "shim");
  assert.equal(report.pages, pages);
  assert.equal(report.exact, true);
  const b = report.bytes;
  assert.equal(b.kvRowsPerToken, s.kvBytesPerToken);
  assert.equal(b.kvRows, N * s.kvBytesPerToken);
  assert.equal(
    b.kvMeta,
    pages * (PAGE_FIXED_BYTES + PAGE_LAYER_BYTES * s.layers.attention) + N * CELL_META_BYTES,
  );
  assert.equal(
    b.conv,
    s.convBytes + RECURRENT_LAYER_BYTES * s.layers.recurrent + RECURRENT_HEAD_BYTES,
  );
  assert.equal(b.ssm, s.ssmBytes + RECURRENT_LAYER_BYTES * s.layers.recurrent);
  assert.equal(b.swa + b.mtpKv + b.mtpHidden + b.recurrentWhole, 0);
  assert.equal(b.total, b.kvRows + b.kvMeta + b.conv + b.ssm);
  // Nemotron 3 Super's proportion: the fixed recurrent state weighs as much as ~20K KV tokens.
  assert.equal(Math.round(s.recurrentTokenEquivalent), 20840);
});

Deno.test("state inspect on hybrid-moe-mtp reports MTP draft KV and hidden-row sizes equal to its dimensions", async () => {
  const spec = familySpec("hybrid-moe-mtp", "tiny");
  const s = expectedStateBytes(spec, "f16");
  const report = await inspect([
    "--model",
    await testModel("hybrid-moe-mtp"),
    "--mtp",
    "--prompt-tokens",
    "1024",
    "--chunk-tokens",
    "256",
    "--ctx",
    "2048",
  ]);
  const b = report.bytes;
  assert.equal(report.exact, true);
  assert.equal(b.kvRowsPerToken, s.kvBytesPerToken);
  assert.equal(b.mtpKvPerToken, s.mtpKvBytesPerToken);
  const mtpMeta = 4 * (PAGE_FIXED_BYTES + PAGE_LAYER_BYTES * s.layers.mtp) + 1024 * CELL_META_BYTES;
  assert.equal(b.mtpKv, 1024 * s.mtpKvBytesPerToken + mtpMeta);
  assert.equal(b.mtpHidden, spec.nEmbd * 4);
  assert.equal(b.ssm, s.ssmBytes + RECURRENT_LAYER_BYTES * s.layers.recurrent);
});
