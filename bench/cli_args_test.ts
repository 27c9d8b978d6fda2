import assert from "node:assert/strict";
import { numberList } from "./cli_args.ts";

Deno.test("numberList reads comma-separated numbers and names the flag on bad input", () => {
  assert.deepEqual(numberList("--rtts", "0.2, 2,10"), [0.2, 2, 10]);
  assert.throws(() => numberList("--rates", "100,fast"), /--rates 100,fast: expected/);
  assert.throws(() => numberList("--mib", ""), /--mib : expected/);
});
