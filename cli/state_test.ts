import assert from "node:assert/strict";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

Deno.test("state inspect measures bytes by component from a real export, bit-exact", async () => {
  const model = await testModel("hybrid");
  const args = [
    "state",
    "inspect",
    "--model",
    model,
    "--prompt-tokens",
    "1000",
    "--chunk-tokens",
    "256",
  ];
  const r = await runCliProcess([...args, "--ctx", "2048", "--json"]);
  assert.equal(r.code, 0, r.stderr);
  const report = JSON.parse(r.stdout);
  assert.equal(report.memory, "hybrid");
  assert.equal(report.pages, 4);
  assert.equal(report.exact, true);
  // Tiny hybrid: 2 attention layers x (K + V) x 2 heads x 32 x f16 = 512 B per token.
  assert.equal(report.bytes.kvRowsPerToken, 512);
  assert.ok(
    report.bytes.conv > 0 && report.bytes.ssm > 0,
    "recurrent snapshot split into conv and ssm",
  );
  assert.equal(report.bytes.swa, 0);
  const text = await runCliProcess([...args, "--ctx", "2048", "--public-path"]);
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, /state path: public \(requested\)/);
  assert.match(text.stdout, /continuation\s+bit-exact/);
});

Deno.test("state inspect refuses a prompt that does not fit the context, with a hint", async () => {
  const model = await testModel("dense");
  const r = await runCliProcess([
    "state",
    "inspect",
    "--model",
    model,
    "--prompt-tokens",
    "5000",
    "--ctx",
    "4096",
  ]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /^error: 5000 prompt tokens do not fit --ctx 4096/m);
  assert.match(r.stderr, /^hint: use --ctx 5120/m);
});
