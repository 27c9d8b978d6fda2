#!/usr/bin/env node
// Runs the pinned Deno (from this package's node_modules) on main.ts with the permissions and
// unstable flags the CLI needs, so `npx skippy-disagg ...` and a global `npm install -g .`
// behave exactly like `deno task cli ...`.
//
// The Deno process is this wrapper's child, so the wrapper must pass on the signals an operator
// or a supervisor sends (SIGTERM, SIGINT, SIGHUP) and exit with the child's status: a wrapper
// that exits on its own would leave `serve` running and holding its port.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { constants } from "node:os";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(root, "package.json"));
let denoDir;
try {
  denoDir = dirname(require.resolve("deno/package.json"));
} catch {
  console.error("error: the pinned Deno is not installed: run `npm ci` in " + root);
  process.exit(1);
}
// The deno package's own launcher (bin.cjs) is a second node process that does not pass
// signals on either; run the binary directly, and that launcher only as the named fallback
// when the binary is missing (it then downloads it).
const exe = join(denoDir, process.platform === "win32" ? "deno.exe" : "deno");
const [command, prefix] = existsSync(exe)
  ? [exe, []]
  : [process.execPath, [join(denoDir, "bin.cjs")]];
const args = [
  ...prefix,
  "run",
  "-A",
  "--unstable-net",
  "--config",
  join(root, "deno.json"),
  join(root, "main.ts"),
  ...process.argv.slice(2),
];
const child = spawn(command, args, { stdio: "inherit" });
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => {
    // A Ctrl-C in a terminal reaches the whole process group, child included; passing it on
    // again is harmless (the child's handler is idempotent).
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
  });
}
child.on("error", (error) => {
  console.error(`error: cannot start Deno (${command}): ${error.message}`);
  process.exit(1);
});
child.on("exit", (code, signal) => {
  process.exit(code ?? 128 + (signal ? constants.signals[signal] ?? 0 : 1));
});
