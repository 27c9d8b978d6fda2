import assert from "node:assert/strict";
import { benchUsage, numberList, parseBenchArgs, wholeNumber } from "./cli_args.ts";

Deno.test("numberList reads comma-separated numbers and names the flag on bad input", () => {
  assert.deepEqual(numberList("--rtts", "0.2, 2,10"), [0.2, 2, 10]);
  assert.throws(() => numberList("--rates", "100,fast"), /--rates 100,fast: expected/);
  assert.throws(() => numberList("--mib", ""), /--mib : expected/);
});

Deno.test("parseBenchArgs reads a script's string flags with defaults; benchUsage names them", () => {
  const flags = {
    rates: { default: "100,400", what: "Mbit/s" },
    repeats: { default: "3" },
    out: { default: "", what: "FILE.json" },
  };
  assert.deepEqual(
    { ...parseBenchArgs(flags, ["--repeats", "5"]) },
    { rates: "100,400", repeats: "5", out: "", help: false },
  );
  assert.throws(() => parseBenchArgs(flags, ["--rate", "1"]), /Unknown option '--rate'/);
  assert.equal(
    benchUsage("x.ts", flags),
    "deno run -A --unstable-net bench/x.ts [--rates 100,400 (Mbit/s)] [--repeats 3] [--out FILE.json]",
  );
});

Deno.test("wholeNumber takes a whole number within its range and names the flag otherwise", () => {
  assert.equal(wholeNumber("--repeats", "3", 1, 20), 3);
  assert.equal(wholeNumber("--repeats", "20", 1, 20), 20);
  for (const bad of ["0", "21", "2.5", "three", ""]) {
    assert.throws(
      () => wholeNumber("--repeats", bad, 1, 20),
      /--repeats .*: use a whole number from 1 to 20/,
    );
  }
});
