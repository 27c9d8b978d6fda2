// Root postinstall: builds the native state shim (ffi/shim/) with the pinned Deno when it can.
// It must never fail `npm ci`: on any problem it prints one line and exits 0, and the runtime
// falls back to llama.cpp's public state API (or builds the shim on first use).
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const TIMEOUT_MS = 5 * 60 * 1000;

function main() {
  if (process.env.SKIPPY_SHIM === "off") return "skipped (SKIPPY_SHIM=off)";
  const root = join(dirname(fileURLToPath(import.meta.url)), "..");
  const require = createRequire(join(root, "package.json"));
  let denoBin;
  try {
    denoBin = join(dirname(require.resolve("deno/package.json")), "bin.cjs");
  } catch {
    return "not built (the pinned Deno is not installed)";
  }
  const result = spawnSync(
    process.execPath,
    [denoBin, "run", "-A", "--config", join(root, "deno.json"), join(root, "ffi/shim/build.ts")],
    { cwd: root, encoding: "utf8", timeout: TIMEOUT_MS, stdio: ["ignore", "pipe", "pipe"] },
  );
  const last = `${result.stderr ?? ""}`.trim().split("\n").filter(Boolean).at(-1) ?? "";
  if (result.error) return `not built (${result.error.message})`;
  if (result.status !== 0) {
    return `${last.replace(/^shim: /, "") || `not built (exit ${result.status})`}`;
  }
  return last.replace(/^shim: /, "");
}

let line;
try {
  line = main();
} catch (error) {
  line = `not built (${error instanceof Error ? error.message : String(error)})`;
}
console.log(
  `skippy-disagg: native state shim ${line}${
    /^ready/.test(line) ? "" : "; llama.cpp's public state API will be used"
  }`,
);
process.exit(0);
