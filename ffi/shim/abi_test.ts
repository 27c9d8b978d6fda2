import assert from "node:assert/strict";
import {
  SHIM_CACHE,
  SHIM_CAPINFO,
  SHIM_CAPTURE,
  SHIM_FACT,
  SHIM_MEM,
  SHIM_PAGE,
  SHIM_RC,
  SKIPPY_SHIM_ABI_VERSION,
} from "./abi.ts";

const header = await Deno.readTextFile(new URL("./skippy_shim.h", import.meta.url));

function define(name: string): number {
  const m = new RegExp(`#define ${name}\\s+(-?(?:0x[0-9a-fA-F]+|\\d+))u?\\b`).exec(header);
  assert.ok(m, `${name} is not defined in skippy_shim.h`);
  return Number(m[1]);
}

Deno.test("abi.ts mirrors every constant of skippy_shim.h", () => {
  assert.equal(SKIPPY_SHIM_ABI_VERSION, define("SKIPPY_SHIM_ABI_VERSION"));
  for (const [k, v] of Object.entries(SHIM_MEM)) assert.equal(v, define(`SKIPPY_MEM_${k}`), k);
  for (const [k, v] of Object.entries(SHIM_CACHE)) assert.equal(v, define(`SKIPPY_CACHE_${k}`), k);
  for (const [k, v] of Object.entries(SHIM_RC)) {
    assert.equal(v, define(k === "OK" ? "SKIPPY_OK" : `SKIPPY_${k}`), k);
  }
  for (const [k, v] of Object.entries(SHIM_PAGE)) assert.equal(v, define(`SKIPPY_PAGE_${k}`), k);
  for (const [k, v] of Object.entries(SHIM_FACT)) {
    assert.equal(v, define(k === "LEN" ? "SKIPPY_FACTS_LEN" : `SKIPPY_FACT_${k}`), k);
  }
  for (const [k, v] of Object.entries(SHIM_CAPTURE)) assert.equal(v, define(`SKIPPY_CAPTURE_${k}`));
  for (const [k, v] of Object.entries(SHIM_CAPINFO)) assert.equal(v, define(`SKIPPY_CAPINFO_${k}`));
});

Deno.test("the ABI version is defined once in C", () => {
  assert.equal(header.match(/#define SKIPPY_SHIM_ABI_VERSION/g)?.length, 1);
});
