import assert from "node:assert/strict";
import { runCli } from "./program.ts";
import { labStateModel } from "../testing/models.ts";

/** Runs the CLI, capturing what it prints to stdout and stderr. */
async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const { log, error } = console;
  console.log = (...parts: unknown[]) => out.push(parts.join(" "));
  console.error = (...parts: unknown[]) => err.push(parts.join(" "));
  try {
    const code = await runCli(args);
    return { code, out: out.join("\n"), err: err.join("\n") };
  } finally {
    console.log = log;
    console.error = error;
  }
}

Deno.test("model make writes a model that model info describes", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/m.gguf`;
    const made = await run(["model", "make", "--family", "hybrid-moe-mtp", "--out", path]);
    assert.equal(made.code, 0, made.err);
    assert.match(made.out, /Wrote hybrid-moe-mtp tiny \(seed 0\)/);
    const text = await run(["model", "info", path]);
    assert.equal(text.code, 0, text.err);
    assert.match(text.out, /architecture {2}nemotron_h_moe \(skippy hybrid-moe-mtp tiny, seed 0\)/);
    assert.match(text.out, /pattern {7}M E M A E M E M A E P/);
    assert.match(text.out, /recurrent \(fixed\) +79,360 B/);
    const json = await run(["model", "info", path, "--json", "--kv-type", "f32"]);
    const report = JSON.parse(json.out);
    assert.equal(report.layerPattern, "MEMAEMEMAEP");
    assert.equal(report.state.kvBytesPerToken, 1024);
    assert.equal(report.state.mtpKvBytesPerToken, 512);
    assert.deepEqual(report.layerCounts, { mamba: 4, moe: 4, attention: 2, mtp: 1 });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("model make names the valid families and presets in a one-line error", async () => {
  const family = await run(["model", "make", "--family", "moe", "--out", "/tmp/never.gguf"]);
  assert.equal(family.code, 2);
  assert.match(family.err, /^error: Unknown model family "moe"\nhint: use one of: dense, iswa/);
  const preset = await run(["model", "make", "--family", "dense", "--preset", "xl", "--out", "x"]);
  assert.equal(preset.code, 2);
  assert.match(preset.err, /use one of: tiny, super-mini/);
});

Deno.test("model make says when the output path cannot be written", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const r = await run(["model", "make", "--family", "dense", "--out", `${dir}/none/m.gguf`]);
    assert.equal(r.code, 2);
    assert.match(r.err, /Cannot write ".*none\/m.gguf": its folder does not exist/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("model info refuses a file that is not GGUF", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/notes.txt`, "hello, not a model");
    const r = await run(["model", "info", `${dir}/notes.txt`]);
    assert.equal(r.code, 1);
    assert.match(r.err, /not a GGUF file \(bad magic\)/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

for (const family of ["hybrid", "hybrid-moe-mtp"] as const) {
  Deno.test(`model info of the lab-state ${family} model measures Super's state sizes at runtime`, async () => {
    const path = await labStateModel(family);
    const r = await run(["model", "info", path, "--json"]);
    assert.equal(r.code, 0, r.err);
    const report = JSON.parse(r.out);
    assert.equal(report.state.kvBytesPerToken, 8192);
    assert.equal(report.state.recurrentBytes, 172_687_360);
    assert.equal(report.runtime.kvBytesPerToken, report.state.kvBytesPerToken);
    assert.equal(report.runtime.recurrentBytes, report.state.recurrentBytes);
    assert.ok(report.runtime.fixedBytes >= report.runtime.recurrentBytes, "framing is extra");
  });
}
