/**
 * One line on stderr per process for each distinct fallback or degraded mode, so that none is
 * silent and none repeats per request. Lines name modes and reasons, never request content.
 */

const said = new Set<string>();

/**
 * Writes `skippy: <line>` to stderr the first time this process sees `line`; later calls with
 * the same line do nothing. Returns whether it wrote.
 *
 * @example
 * ```ts
 * sayOnce("layer capture off (no shim): the recurrent snapshot is exported after prefill");
 * ```
 */
export function sayOnce(line: string): boolean {
  if (said.has(line)) return false;
  said.add(line);
  console.error(`skippy: ${line}`);
  return true;
}
