/**
 * The one msgpack configuration used on the wire. Plain msgpack only: records/structures
 * (msgpackr's extension for repeated shapes) are off, so any msgpack implementation can read
 * our headers and a peer cannot make us keep shared structure state across frames.
 */
import { Packr, Unpackr } from "msgpackr";

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });

/** Encodes `value` as msgpack. The result is only valid until the next call: copy it. */
export function packMsgpack(value: unknown): Uint8Array {
  return packr.pack(value);
}

/** Decodes exactly one msgpack value; throws if the bytes are malformed or have trailing data. */
export function unpackMsgpack(bytes: Uint8Array): unknown {
  return unpackr.unpack(bytes);
}
