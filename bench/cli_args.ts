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
