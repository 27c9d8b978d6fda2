import { parseArgs } from "node:util";
import { cacheDir } from "../cli/paths.ts";
import { ensureModelFile } from "../models/mod.ts";
/**
 * Flag values of the standalone bench scripts (parsed with `node:util` parseArgs, as the
 * other scripts are): a comma-separated list of numbers, refused with the flag's name when a
 * value is not a finite number.
 *
 * @example
 * ```ts
 * numberList("--rates", "100,400,1000"); // [100, 400, 1000]
 * ```
 */
export function numberList(flag: string, text: string): number[] {
  const parts = text.split(",").map((s) => s.trim());
  const out = parts.map(Number);
  if (parts.some((s) => s === "") || out.some((x) => !Number.isFinite(x))) {
    throw new Error(`${flag} ${text}: expected comma-separated numbers, e.g. ${flag} 1,2,3`);
  }
  return out;
}

/**
 * A whole-number flag within [min, max]; a value outside, or not a whole number, is refused with
 * the flag's name and the range.
 *
 * @example
 * ```ts
 * wholeNumber("--repeats", "3", 1, 20); // 3
 * ```
 */
export function wholeNumber(flag: string, text: string, min: number, max: number): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new Error(`${flag} ${text}: use a whole number from ${min} to ${max}`);
  }
  return n;
}

/** `read()`, or where it refuses a flag, its message on stderr and exit status 2 (no stack). */
export function orExit<T>(read: () => T): T {
  try {
    return read();
  } catch (error) {
    console.error(`error: ${(error as Error).message}`);
    Deno.exit(2);
  }
}

/** `--model`, or where it is not given, lab-state (seed 1), made on first use. */
export function modelOrLabState(model: string | undefined): Promise<string> {
  return model !== undefined ? Promise.resolve(model) : ensureModelFile(`${cacheDir()}/models`, {
    family: "hybrid",
    preset: "lab-state",
    seed: 1,
  });
}

/** A bench script's string flags: each one's default and, for the usage line, what it is. */
export type BenchFlags = Record<string, { default: string; what?: string }>;

/**
 * The usage line of `script` (a path under bench/) from its flags: `[--name default (what)]`,
 * or `[--name what]` where the default is empty.
 *
 * @example
 * ```ts
 * benchUsage("cc_bench.ts", { rates: { default: "100,400", what: "Mbit/s" } });
 * // "deno run -A --unstable-net bench/cc_bench.ts [--rates 100,400 (Mbit/s)]"
 * ```
 */
export function benchUsage(script: string, flags: BenchFlags): string {
  const parts = Object.entries(flags).map(([name, f]) =>
    f.default === ""
      ? `[--${name} ${f.what ?? "VALUE"}]`
      : `[--${name} ${f.default}${f.what ? ` (${f.what})` : ""}]`
  );
  return [`deno run -A --unstable-net bench/${script}`, ...parts].join(" ");
}

/**
 * Parses `args` as the string flags in `flags` (plus `--help`); throws naming an unknown flag
 * (`node:util` parseArgs, strict).
 */
export function parseBenchArgs<F extends BenchFlags>(
  flags: F,
  args: string[],
): { [K in keyof F]: string } & { help: boolean } {
  const options = Object.fromEntries(
    Object.entries(flags).map((
      [name, f],
    ) => [name, { type: "string" as const, default: f.default }]),
  );
  const { values } = parseArgs({
    args,
    options: { ...options, help: { type: "boolean", default: false } },
  });
  return values as unknown as { [K in keyof F]: string } & { help: boolean };
}

/**
 * A bench script's flags from `args`: `--help` prints `benchUsage` and exits 0; a flag it does
 * not have is said in one line with the usage, exit 2.
 */
export function benchArgs<F extends BenchFlags>(
  script: string,
  flags: F,
  args: string[] = Deno.args,
): { [K in keyof F]: string } {
  let values;
  try {
    values = parseBenchArgs(flags, args);
  } catch (error) {
    console.error(`error: ${(error as Error).message}\nusage: ${benchUsage(script, flags)}`);
    Deno.exit(2);
  }
  if (values.help) {
    console.log(benchUsage(script, flags));
    Deno.exit(0);
  }
  return values;
}
