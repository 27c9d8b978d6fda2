/**
 * Byte pieces in a manifest (schema 3): the shape of one piece, and the components with each
 * set of pieces joined into the whole they were cut from, for the completeness rules.
 */
import type { ManifestComponent } from "./manifest.ts";
import {
  type BytePiece,
  componentRule,
  describeComponent,
  firstTilingFault,
  formatPiece,
  formatRange,
  rangeWithin,
  type StateBounds,
} from "./schema.ts";

/** True when `c.piece` is a well-formed piece of a kind that may be cut, `c.bytes` long. */
export function pieceShapeOk(c: ManifestComponent, bounds: StateBounds): boolean {
  const p = c.piece as Partial<BytePiece> | null;
  return typeof p === "object" && p !== null && componentRule(c.kind).pieces &&
    Number.isSafeInteger(p.of) && p.of! >= 1 && p.of! <= bounds.stateBytesMax &&
    rangeWithin(p.range, p.of!) && p.range[1] - p.range[0] === c.bytes;
}

/**
 * The components with each set of byte pieces replaced by the whole it is cut from (listed
 * where its first piece was), or a message naming the first piece that is missing,
 * duplicated or of a different size.
 */
export function joinPieces(list: readonly ManifestComponent[]): ManifestComponent[] | string {
  const key = (c: ManifestComponent) =>
    `${c.kind} ${formatRange(c.layerRange)} ${formatRange(c.tokenRange)}`;
  const out: ManifestComponent[] = [];
  const groups = new Map<string, ManifestComponent[]>();
  for (const c of list) {
    const group = c.piece ? groups.get(key(c)) : undefined;
    if (group) group.push(c);
    else out.push(c);
    if (c.piece && !group) groups.set(key(c), [c]);
  }
  for (const [at, c] of out.entries()) {
    if (!c.piece) continue;
    const group = groups.get(key(c))!;
    const name = describeComponent(c.kind, c.layerRange, c.tokenRange);
    const of = c.piece.of;
    const other = group.find((p) => p.piece!.of !== of);
    if (other) return `${name} pieces of ${of} and ${other.piece!.of} bytes`;
    const fault = firstTilingFault(group.map((p) => p.piece!.range), of);
    if (fault) {
      const word = fault.fault === "gap" ? "missing" : "duplicated";
      return `${name}${formatPiece({ range: fault.range, of })} ${word}`;
    }
    const { kind, layerRange, tokenRange, checksum } = c;
    out[at] = { kind, layerRange, tokenRange, bytes: of, checksum };
  }
  return out;
}
