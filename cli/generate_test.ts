import assert from "node:assert/strict";
import { encodeGguf, gv, writeChunksToFile } from "../models/mod.ts";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

/** A bad-input outcome: non-zero exit, an `error:` line with a `hint:`, and no stack trace. */
function assertCleanError(r: { code: number; stderr: string }, code: number, pattern: RegExp) {
  assert.equal(r.code, code, r.stderr);
  const lines = r.stderr.trim().split("\n").filter((l) => !l.startsWith("llama.cpp:"));
  assert.match(lines[0], /^error: /);
  assert.match(lines[0], pattern);
  assert.ok(lines.length <= 2, `expected at most an error and a hint line, got:\n${r.stderr}`);
  assert.ok(!/\n\s+at /.test(r.stderr), "no stack trace without --debug");
}

Deno.test("generate from the tiny hybrid model prints text and JSON with numerics", async () => {
  const model = await testModel("hybrid");
  const r = await runCliProcess([
    "generate",
    "--model",
    model,
    "--prompt",
    "Once upon a time",
    "-n",
    "8",
    "--json",
  ]);
  assert.equal(r.code, 0, r.stderr);
  const json = JSON.parse(r.stdout);
  assert.equal(json.tokens.length, 8);
  assert.equal(json.numerics.threads, 2);
  assert.equal(json.numerics.flashAttention, false);
  assert.equal(json.numerics.typeK, "f16");
  assert.equal(typeof json.numerics.cpuVariant, "string");
  const text = await runCliProcess([
    "generate",
    "--model",
    model,
    "--prompt",
    "Once upon a time",
    "-n",
    "8",
  ]);
  assert.equal(text.code, 0);
  assert.equal(text.stdout.trimEnd(), json.text.trimEnd());
});

Deno.test("a missing model file is a one-line error", async () => {
  const r = await runCliProcess(["generate", "--model", "/nonexistent/m.gguf", "--prompt", "x"]);
  assertCleanError(r, 1, /does not exist/);
});

Deno.test("a file that is not GGUF is refused before llama.cpp sees it", async () => {
  const path = await Deno.makeTempFile({ suffix: ".gguf" });
  await Deno.writeTextFile(path, "this is not a model at all");
  const r = await runCliProcess(["generate", "--model", path, "--prompt", "x"]);
  assertCleanError(r, 1, /is not a GGUF file/);
});

Deno.test("a truncated GGUF says llama.cpp could not load it", async () => {
  const bytes = await Deno.readFile(await testModel("dense"));
  const path = await Deno.makeTempFile({ suffix: ".gguf" });
  await Deno.writeFile(path, bytes.subarray(0, bytes.length >> 1));
  const r = await runCliProcess(["generate", "--model", path, "--prompt", "x"]);
  assertCleanError(r, 1, /could not load/);
});

Deno.test("an unsupported architecture is named in the error", async () => {
  const path = await Deno.makeTempFile({ suffix: ".gguf" });
  await writeChunksToFile(
    path,
    encodeGguf([["general.architecture", gv.str("skippy-unknown")]], []),
  );
  const r = await runCliProcess(["generate", "--model", path, "--prompt", "x"]);
  assertCleanError(r, 1, /architecture .*"skippy-unknown"/);
});

Deno.test("a context larger than the model's training context is refused", async () => {
  const r = await runCliProcess([
    "generate",
    "--model",
    await testModel("dense"),
    "--ctx",
    "1000000",
    "--prompt",
    "x",
  ]);
  assertCleanError(r, 2, /exceeds the model's training context/);
});

Deno.test("wrong flags exit with code 2 and say what was wrong", async () => {
  assertCleanError(
    await runCliProcess(["generate", "--threads", "abc", "--prompt", "x"]),
    2,
    /--threads/,
  );
  assertCleanError(await runCliProcess(["generate", "--bogus"]), 2, /unknown option '--bogus'/);
  assertCleanError(
    await runCliProcess(["generate", "--prompt", "a", "--prompt-file", "b"]),
    2,
    /exactly one/,
  );
});

Deno.test("--debug shows the stack trace", async () => {
  const r = await runCliProcess([
    "--debug",
    "generate",
    "--model",
    "/nonexistent.gguf",
    "--prompt",
    "x",
  ]);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /\n\s+at /);
});
