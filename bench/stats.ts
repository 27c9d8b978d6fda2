/** Small statistics for benchmarks: medians over repeats, measured side by side. */

export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** Runs `fn` `repeats` times (after `warmup` unmeasured runs); returns each run's result. */
export async function repeat<T>(
  repeats: number,
  fn: (i: number) => Promise<T> | T,
  warmup = 0,
): Promise<T[]> {
  for (let i = 0; i < warmup; i++) await fn(-1 - i);
  const out: T[] = [];
  for (let i = 0; i < repeats; i++) out.push(await fn(i));
  return out;
}

/** Milliseconds `fn` takes. */
export async function timeMs(fn: () => Promise<unknown> | unknown): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/** Formats rows as an aligned plain-text table. */
export function table(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map((c) => typeof c === "number" ? fmtNum(c) : c))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => String(r[i] ?? "").length)));
  const line = (r: (string | number)[]) =>
    r.map((c, i) => String(c ?? "").padStart(widths[i])).join("  ");
  return [line(cells[0]), widths.map((w) => "-".repeat(w)).join("  "), ...cells.slice(1).map(line)]
    .join("\n");
}

function fmtNum(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  if (Number.isInteger(n)) return String(n);
  const a = Math.abs(n);
  return a >= 100 ? n.toFixed(0) : a >= 10 ? n.toFixed(1) : a >= 1 ? n.toFixed(2) : n.toFixed(3);
}
