/**
 * Which special-token markers of a rendered chat prompt the template wrote (and so become
 * special tokens), as opposed to text a client sent (which stays text whatever it contains).
 *
 * The template is rendered twice: with the real messages (the prompt), and with each message's
 * content replaced by a sentinel (private-use characters no tokenizer marker contains). The
 * sentinel rendering cuts the prompt into the template's own segments and the content slots
 * between them. The prompt is then matched against that shape: each slot holds the message's
 * content as sent, or trimmed (templates such as Llama 3's apply `| trim`). Markers are
 * looked for in the template's segments only, longest first at each position, as llama.cpp's
 * special-token partition does; a marker never spans a segment and a content slot.
 *
 * When the prompt does not match the shape (the template rewrites content in some other way),
 * no marker is special and the caller names that fallback.
 *
 * Spans are UTF-8 byte offsets into the prompt, flat `[start0, end0, start1, end1, ...]`: what
 * the workers tokenize as special tokens (serve/prompt_tokens.ts).
 */

/** Private-use code points that open and close a content sentinel. */
const OPEN = "\uE000";
const CLOSE = "\uE001";

/** The content sentinel of message `i`. */
export function sentinel(i: number): string {
  return `${OPEN}${i}${CLOSE}`;
}

/** A rendered sentinel prompt cut into template segments and the content slots between them. */
interface Shape {
  /** n + 1 segments of template text around n slots. */
  segments: string[];
  /** The message index each slot shows. */
  slots: number[];
}

function shapeOf(rendered: string, messages: number): Shape | null {
  const segments: string[] = [];
  const slots: number[] = [];
  const pattern = new RegExp(`${OPEN}(\\d+)${CLOSE}`, "g");
  let last = 0;
  for (const m of rendered.matchAll(pattern)) {
    const index = Number(m[1]);
    if (index >= messages) return null;
    segments.push(rendered.slice(last, m.index));
    slots.push(index);
    last = m.index! + m[0].length;
  }
  segments.push(rendered.slice(last));
  // A sentinel character left over means the template cut one apart: no shape to trust.
  if (segments.some((s) => s.includes(OPEN) || s.includes(CLOSE))) return null;
  return { segments, slots };
}

/** Special-token texts indexed by first character, longest first (llama.cpp's order). */
export class MarkerSet {
  readonly #byFirst = new Map<string, string[]>();

  constructor(texts: Iterable<string>) {
    for (const t of texts) {
      if (t.length === 0) continue;
      const list = this.#byFirst.get(t[0]) ?? [];
      list.push(t);
      this.#byFirst.set(t[0], list);
    }
    for (const list of this.#byFirst.values()) list.sort((a, b) => b.length - a.length);
  }

  get size(): number {
    let n = 0;
    for (const list of this.#byFirst.values()) n += list.length;
    return n;
  }

  /** The longest marker starting at `text[i]`, or null. */
  at(text: string, i: number): string | null {
    for (const m of this.#byFirst.get(text[i]) ?? []) if (text.startsWith(m, i)) return m;
    return null;
  }
}

/**
 * The template's own markers in `prompt` as UTF-8 byte spans, or null when the prompt does not
 * match the sentinel rendering's shape (see the file comment).
 */
export function templateMarkerSpans(
  prompt: string,
  sentinelRendering: string,
  contents: readonly string[],
  markers: MarkerSet,
): number[] | null {
  const shape = shapeOf(sentinelRendering, contents.length);
  if (shape === null) return null;
  // Template ranges of the prompt, in UTF-16 offsets.
  const ranges: [number, number][] = [];
  let at = 0;
  for (let k = 0; k < shape.segments.length; k++) {
    const segment = shape.segments[k];
    if (!prompt.startsWith(segment, at)) return null;
    ranges.push([at, at + segment.length]);
    at += segment.length;
    if (k === shape.slots.length) break;
    const content = contents[shape.slots[k]];
    const next = shape.segments[k + 1];
    const last = k + 1 === shape.slots.length;
    const fits = (c: string) =>
      prompt.startsWith(c, at) && prompt.startsWith(next, at + c.length) &&
      (!last || at + c.length + next.length === prompt.length);
    const shown = [content, content.trim(), content.trimStart(), content.trimEnd()].find(fits);
    if (shown === undefined) return null;
    at += shown.length;
  }
  if (at !== prompt.length) return null;
  const spans: number[] = [];
  const encoder = new TextEncoder();
  let byteAt = 0;
  let charAt = 0;
  const bytesTo = (i: number) => {
    byteAt += encoder.encode(prompt.slice(charAt, i)).length;
    charAt = i;
    return byteAt;
  };
  for (const [start, end] of ranges) {
    for (let i = start; i < end;) {
      const m = markers.at(prompt, i);
      if (m === null || i + m.length > end) {
        i++;
        continue;
      }
      spans.push(bytesTo(i), bytesTo(i + m.length));
      i += m.length;
    }
  }
  return spans;
}
