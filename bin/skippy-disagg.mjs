#!/usr/bin/env node
// Runs the pinned Deno (from this package's node_modules) on main.ts with the permissions and
// unstable flags the CLI needs, so `npx skippy-disagg ...` and a global `npm install -g .`
// behave exactly like `deno task cli ...`.
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(root, "package.json"));
let denoBin;
try {
  denoBin = join(dirname(require.resolve("deno/package.json")), "bin.cjs");
} catch {
  console.error("error: the pinned Deno is not installed: run `npm ci` in " + root);
  process.exit(1);
}
const args = [
  "run",
  "-A",
  "--unstable-net",
  "--config",
  join(root, "deno.json"),
  join(root, "main.ts"),
  ...process.argv.slice(2),
];
const result = spawnSync(process.execPath, [denoBin, ...args], { stdio: "inherit" });
process.exit(result.status ?? 1);
