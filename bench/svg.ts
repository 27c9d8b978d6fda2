/**
 * Minimal SVG charts for benchmark reports: line charts (series of x/y points) and grouped
 * bar charts. Pure string output, no dependencies, readable in any browser.
 */

export interface Series {
  name: string;
  /**
   * `yLow`/`yHigh` (scatter charts only): the range the point's repeats measured, drawn as a
   * vertical whisker through it.
   */
  points: { x: number; y: number; yLow?: number; yHigh?: number }[];
}

export interface ChartOptions {
  title: string;
  xLabel: string;
  yLabel: string;
  width?: number;
  height?: number;
  /** Log-scale x axis (context lengths, bandwidths). */
  logX?: boolean;
  /** Force the y axis to start at zero (default true). */
  yFromZero?: boolean;
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];
const MARGIN = { left: 70, right: 160, top: 40, bottom: 50 };

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function niceTicks(min: number, max: number, count = 5): number[] {
  if (max <= min) return [min];
  const raw = (max - min) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw;
  const ticks: number[] = [];
  for (let t = Math.ceil(min / step) * step; t <= max + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

function fmt(n: number): string {
  const a = Math.abs(n);
  if (a >= 1e9) return `${+(n / 1e9).toPrecision(3)}G`;
  if (a >= 1e6) return `${+(n / 1e6).toPrecision(3)}M`;
  if (a >= 1e3) return `${+(n / 1e3).toPrecision(3)}k`;
  return `${+n.toPrecision(3)}`;
}

function frame(o: ChartOptions, w: number, h: number, body: string): string {
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" ` +
    `font-family="sans-serif" font-size="12">\n` +
    `<rect width="${w}" height="${h}" fill="white"/>\n` +
    `<text x="${w / 2}" y="22" text-anchor="middle" font-size="15">${esc(o.title)}</text>\n` +
    `<text x="${MARGIN.left + (w - MARGIN.left - MARGIN.right) / 2}" y="${h - 10}" ` +
    `text-anchor="middle">${esc(o.xLabel)}</text>\n` +
    `<text transform="translate(16,${MARGIN.top + (h - MARGIN.top - MARGIN.bottom) / 2}) ` +
    `rotate(-90)" text-anchor="middle">${esc(o.yLabel)}</text>\n${body}</svg>\n`;
}

function legend(names: string[], x: number): string {
  return names.map((name, i) =>
    `<rect x="${x}" y="${MARGIN.top + i * 18}" width="12" height="12" ` +
    `fill="${COLORS[i % COLORS.length]}"/><text x="${x + 18}" y="${MARGIN.top + i * 18 + 10}">` +
    `${esc(name)}</text>`
  ).join("\n");
}

/** A line chart with one line per series. */
export function lineChart(series: Series[], o: ChartOptions): string {
  const w = o.width ?? 720;
  const h = o.height ?? 420;
  const pw = w - MARGIN.left - MARGIN.right;
  const ph = h - MARGIN.top - MARGIN.bottom;
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return frame(o, w, h, "");
  const tx = (x: number) => o.logX ? Math.log10(Math.max(x, 1e-12)) : x;
  const xs = all.map((p) => tx(p.x));
  const ys = all.map((p) => p.y);
  const xMin = Math.min(...xs);
  const xMax = Math.max(...xs) === xMin ? xMin + 1 : Math.max(...xs);
  const yMin = (o.yFromZero ?? true) ? Math.min(0, ...ys) : Math.min(...ys);
  const yMax = Math.max(...ys) === yMin ? yMin + 1 : Math.max(...ys) * 1.05;
  const px = (x: number) => MARGIN.left + ((tx(x) - xMin) / (xMax - xMin)) * pw;
  const py = (y: number) => MARGIN.top + ph - ((y - yMin) / (yMax - yMin)) * ph;
  let body = `<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${pw}" height="${ph}" ` +
    `fill="none" stroke="#999"/>\n`;
  for (const t of niceTicks(yMin, yMax)) {
    body += `<line x1="${MARGIN.left}" x2="${MARGIN.left + pw}" y1="${py(t)}" y2="${py(t)}" ` +
      `stroke="#eee"/><text x="${MARGIN.left - 6}" y="${py(t) + 4}" text-anchor="end">` +
      `${fmt(t)}</text>\n`;
  }
  const xTicks = [...new Set(all.map((p) => p.x))].sort((a, b) => a - b);
  for (const t of xTicks.length <= 12 ? xTicks : niceTicks(xMin, xMax)) {
    body += `<text x="${px(t)}" y="${MARGIN.top + ph + 16}" text-anchor="middle">${fmt(t)}` +
      `</text>\n`;
  }
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = [...s.points].sort((a, b) => a.x - b.x);
    body += `<polyline fill="none" stroke="${color}" stroke-width="2" points="` +
      pts.map((p) => `${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join(" ") + `"/>\n`;
    body += pts.map((p) =>
      `<circle cx="${px(p.x).toFixed(1)}" cy="${py(p.y).toFixed(1)}" r="3" fill="${color}"/>`
    ).join("") + "\n";
  });
  body += legend(series.map((s) => s.name), MARGIN.left + pw + 12);
  return frame(o, w, h, body);
}

/** A grouped bar chart: one group per category, one bar per series. */
export function barChart(
  categories: string[],
  series: { name: string; values: number[] }[],
  o: ChartOptions,
): string {
  const w = o.width ?? 720;
  const h = o.height ?? 420;
  const pw = w - MARGIN.left - MARGIN.right;
  const ph = h - MARGIN.top - MARGIN.bottom;
  const yMax = Math.max(1e-12, ...series.flatMap((s) => s.values)) * 1.1;
  const py = (y: number) => MARGIN.top + ph - (y / yMax) * ph;
  const groupW = pw / Math.max(1, categories.length);
  const barW = (groupW * 0.8) / Math.max(1, series.length);
  let body = `<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${pw}" height="${ph}" ` +
    `fill="none" stroke="#999"/>\n`;
  for (const t of niceTicks(0, yMax)) {
    body += `<line x1="${MARGIN.left}" x2="${MARGIN.left + pw}" y1="${py(t)}" y2="${py(t)}" ` +
      `stroke="#eee"/><text x="${MARGIN.left - 6}" y="${py(t) + 4}" text-anchor="end">` +
      `${fmt(t)}</text>\n`;
  }
  categories.forEach((c, ci) => {
    const x0 = MARGIN.left + ci * groupW + groupW * 0.1;
    series.forEach((s, si) => {
      const v = s.values[ci] ?? 0;
      body += `<rect x="${(x0 + si * barW).toFixed(1)}" y="${py(v).toFixed(1)}" ` +
        `width="${(barW - 2).toFixed(1)}" height="${(MARGIN.top + ph - py(v)).toFixed(1)}" ` +
        `fill="${COLORS[si % COLORS.length]}"><title>${esc(s.name)}: ${fmt(v)}</title></rect>\n`;
    });
    body += `<text x="${x0 + groupW * 0.4}" y="${MARGIN.top + ph + 16}" text-anchor="middle">` +
      `${esc(c)}</text>\n`;
  });
  body += legend(series.map((s) => s.name), MARGIN.left + pw + 12);
  return frame(o, w, h, body);
}

/**
 * Predicted (x) against measured (y), one colour per series, on log axes, with the y = x line
 * and a band of +-`bandShare` around it: points inside the band are predictions within it.
 */
export function scatterChart(
  series: Series[],
  o: ChartOptions & { bandShare?: number },
): string {
  const w = o.width ?? 720;
  const h = o.height ?? 560;
  const pw = w - MARGIN.left - MARGIN.right;
  const ph = h - MARGIN.top - MARGIN.bottom;
  const all = series.flatMap((s) => s.points).filter((p) => p.x > 0 && p.y > 0);
  if (all.length === 0) return frame(o, w, h, "");
  const vals = all.flatMap((p) => [p.x, p.y, p.yLow ?? p.y, p.yHigh ?? p.y]).filter((v) => v > 0);
  const lo = Math.log10(Math.min(...vals) / 1.3), hi = Math.log10(Math.max(...vals) * 1.3);
  const px = (v: number) => MARGIN.left + ((Math.log10(v) - lo) / (hi - lo)) * pw;
  const py = (v: number) => MARGIN.top + ph - ((Math.log10(v) - lo) / (hi - lo)) * ph;
  const a = 10 ** lo, b = 10 ** hi, band = o.bandShare ?? 0.15;
  let body = `<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${pw}" height="${ph}" ` +
    `fill="none" stroke="#999"/>\n`;
  body += `<polygon fill="#eef6ee" points="${px(a)},${py(a * (1 + band))} ${px(b / (1 + band))},` +
    `${py(b)} ${px(b)},${py(b)} ${px(b)},${py(b * (1 - band))} ${px(a)},${py(a * (1 - band))}"/>\n`;
  body += `<line x1="${px(a)}" y1="${py(a)}" x2="${px(b)}" y2="${py(b)}" stroke="#888" ` +
    `stroke-dasharray="4 3"/>\n`;
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e++) {
    for (const m of [1, 2, 5]) {
      const t = m * 10 ** e;
      if (t < a || t > b) continue;
      body += `<text x="${px(t)}" y="${MARGIN.top + ph + 16}" text-anchor="middle">${fmt(t)}` +
        `</text><text x="${MARGIN.left - 6}" y="${py(t) + 4}" text-anchor="end">${fmt(t)}</text>\n`;
    }
  }
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    body += s.points.filter((p) => p.x > 0 && p.y > 0).map((p) => {
      const lo = p.yLow !== undefined && p.yLow > 0 ? p.yLow : p.y;
      const hi = p.yHigh !== undefined && p.yHigh > 0 ? p.yHigh : p.y;
      const whisker = lo < hi
        ? `<line x1="${px(p.x).toFixed(1)}" y1="${py(lo).toFixed(1)}" x2="${px(p.x).toFixed(1)}" ` +
          `y2="${py(hi).toFixed(1)}" stroke="${color}" stroke-opacity="0.6"/>`
        : "";
      return whisker +
        `<circle cx="${px(p.x).toFixed(1)}" cy="${py(p.y).toFixed(1)}" r="3.5" fill="${color}" ` +
        `fill-opacity="0.8"/>`;
    }).join("") + "\n";
  });
  body += legend(
    [...series.map((s) => s.name), `y = x (band: +-${Math.round(band * 100)}%)`],
    MARGIN.left + pw + 12,
  );
  return frame(o, w, h, body);
}
