/**
 * The batch section's comparison with node-llama-cpp (same llama.cpp build: the
 * `@node-llama-cpp/<platform>@3.21.1` prebuilt libraries this project loads are node-llama-cpp
 * 3.21.1's own): installed at bench time into a scratch folder (`.cache/node-llama-cpp`, never
 * into the project's dependencies) from the npm cache tarball when present, else the registry,
 * then `bench/node_llama_cpp_run.mjs` runs with `node` on the same model and requests. Every
 * way it cannot run returns a skip with the reason, never a number.
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** Where a cached node-llama-cpp tarball may be (the shared checkout's npm cache). */
const TARBALL_CANDIDATES = [
  "../.cache/npm/node-llama-cpp-3.21.1.tgz",
  "/work/main/.cache/npm/node-llama-cpp-3.21.1.tgz",
];
const VERSION = "3.21.1";
/** A scratch install takes a while on a slow registry; beyond this it is skipped. */
const INSTALL_TIMEOUT_MS = 300_000;
/** One run of every concurrency level; the tiny models take seconds. */
const RUN_TIMEOUT_MS = 600_000;

export interface NodeLlamaCppRow {
  concurrency: number;
  tokensPerSec: number;
  tokensPerCpuSec: number;
  tokens: number[][];
}

export type NodeLlamaCppResult =
  | { ok: true; rows: NodeLlamaCppRow[] }
  | { ok: false; skipped: string };

const ROOT = fileURLToPath(new URL("..", import.meta.url));

async function run(
  cmd: string,
  args: string[],
  cwd: string,
  timeoutMs: number,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command(cmd, {
    args,
    cwd,
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(timeoutMs),
  }).spawn();
  const out = await child.output();
  const decode = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
}

/** The scratch install, made if missing; a skip reason when it cannot be. */
async function ensureInstalled(dir: string): Promise<string | null> {
  const installed = join(dir, "node_modules", "node-llama-cpp", "package.json");
  const version = await Deno.readTextFile(installed).then((t) => JSON.parse(t).version, () => null);
  if (version === VERSION) return null;
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(
    join(dir, "package.json"),
    '{"name":"nlc-bench-scratch","private":true}',
  );
  let source = `node-llama-cpp@${VERSION}`;
  for (const c of TARBALL_CANDIDATES) {
    const path = c.startsWith("/") ? c : join(ROOT, c);
    if (await Deno.stat(path).then((s) => s.isFile, () => false)) {
      source = path;
      break;
    }
  }
  // Scripts off: its postinstall would look for (or build) binaries; the runner asks for
  // `build: "never"` and uses the prebuilt CPU package. On Linux only that one is installed
  // (its other optional packages are GPU builds of several hundred MiB).
  const arch = Deno.build.arch === "x86_64" ? "x64" : "arm64";
  const only = Deno.build.os === "linux"
    ? ["--omit=optional", `@node-llama-cpp/linux-${arch}@${VERSION}`]
    : [];
  const r = await run(
    "npm",
    ["install", "--no-audit", "--no-fund", "--ignore-scripts", ...only, source],
    dir,
    INSTALL_TIMEOUT_MS,
  ).catch((e) => ({ code: -1, stdout: "", stderr: (e as Error).message }));
  if (r.code !== 0) {
    return `npm install of node-llama-cpp ${VERSION} failed: ${
      r.stderr.trim().split("\n").at(-1) ?? "no output"
    }`;
  }
  return null;
}

/** Runs the node-llama-cpp side, or says why it cannot. */
export async function runNodeLlamaCpp(input: {
  modelPath: string;
  prompts: Int32Array[];
  concurrency: number[];
  decodeTokens: number;
  threads: number;
  contextSize: number;
  repeats: number;
}): Promise<NodeLlamaCppResult> {
  const node = await run("node", ["--version"], ROOT, 10_000).catch(() => null);
  if (!node || node.code !== 0) return { ok: false, skipped: "no `node` on this machine" };
  const dir = join(ROOT, ".cache", "node-llama-cpp");
  const skip = await ensureInstalled(dir);
  if (skip) return { ok: false, skipped: skip };
  const runner = join(dir, "node_llama_cpp_run.mjs");
  await Deno.copyFile(join(ROOT, "bench", "node_llama_cpp_run.mjs"), runner);
  const inputPath = join(dir, "input.json");
  await Deno.writeTextFile(
    inputPath,
    JSON.stringify({ ...input, prompts: input.prompts.map((p) => [...p]) }),
  );
  const r = await run("node", [runner, inputPath], dir, RUN_TIMEOUT_MS).catch((e) => ({
    code: -1,
    stdout: "",
    stderr: (e as Error).message,
  }));
  if (r.code !== 0) {
    const last = r.stderr.trim().split("\n").slice(-3).join(" | ");
    return { ok: false, skipped: `node-llama-cpp run failed (exit ${r.code}): ${last}` };
  }
  return { ok: true, rows: JSON.parse(r.stdout.trim().split("\n").at(-1)!).rows };
}
