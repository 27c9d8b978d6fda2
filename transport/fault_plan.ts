/**
 * Fault injection for protocol tests: a declarative, seeded plan of what goes wrong on one
 * direction of one stream, applied by wrapping the sending side's byte stream.
 *
 * The loopback fake (loopback.ts) supports every fault. On a real QUIC RawConnection
 * (`withFaults`) everything but `killPeerAfterBytes` works; a real kill needs a real process
 * (the conformance suite kills a subprocess).
 *
 * Test-only machinery: nothing in the product passes a fault plan.
 */
import { assert } from "../core/errors.ts";
import { randomInt, seededRandom } from "./_prng.ts";
import { type ByteChannel, CloseCode, type RawConnection } from "./channel.ts";
import { FRAME_PREFIX_BYTES, parseFramePrefix } from "./frame.ts";
import { unpackMsgpack } from "./_msgpack.ts";

/** What goes wrong, where. Byte offsets count the faulted direction of the chosen stream. */
export interface FaultPlan {
  /** Seeds every random choice (delay jitter); the same seed replays the same run. */
  seed?: number;
  /** Which side's outgoing bytes are faulted. Default "client". */
  sender?: "client" | "server";
  /** Which stream, in the order the faulted side opened or accepted them; 0 is the control stream. Default 1. */
  streamIndex?: number;
  /** The connection dies (both sides see it closed) after this many bytes. */
  dropConnectionAfterBytes?: number;
  /** The stream ends cleanly after this many bytes, as Deno's `writer.abort()` does. */
  endStreamAfterBytes?: number;
  /** The byte at this offset arrives with its bits flipped. */
  corruptByteAt?: number;
  /**
   * The connection dies just before the first frame whose header `type` is this (e.g.
   * "CommitAck"): that frame and everything after it are lost, and the sender's write still
   * succeeds, as a write into a connection that is dying does.
   */
  dropConnectionBeforeFrameType?: string;
  /** Frame number N (0-based) arrives twice. */
  duplicateFrameIndex?: number;
  /** Every chunk is held this long before delivery (order is kept). */
  delayMs?: number;
  /** Up to this much extra delay per chunk, drawn from the seed. */
  delayJitterMs?: number;
  /** The sending side dies silently after this many bytes; the survivor notices by idle timeout. Loopback only. */
  killPeerAfterBytes?: number;
}

/** Picks one fault from `seed`, placed within the first `streamBytes` bytes. */
export function randomFaultPlan(
  seed: number,
  options: { streamBytes: number; streamIndex?: number },
): FaultPlan {
  const random = seededRandom(seed);
  const at = randomInt(random, 1, Math.max(1, options.streamBytes - 1));
  const base: FaultPlan = { seed, streamIndex: options.streamIndex ?? 1 };
  switch (randomInt(random, 0, 4)) {
    case 0:
      return { ...base, dropConnectionAfterBytes: at };
    case 1:
      return { ...base, endStreamAfterBytes: at };
    case 2:
      return { ...base, corruptByteAt: at };
    case 3:
      return { ...base, duplicateFrameIndex: randomInt(random, 0, 3) };
    default:
      return { ...base, killPeerAfterBytes: at };
  }
}

/** What the faulted stream can do to its connection. */
export interface FaultHooks {
  dropConnection(): void;
  killSender(): void;
}

/** Tracks frame boundaries in a byte stream and keeps the bytes of one chosen frame. */
class _FrameCopier {
  #frame = 0;
  #fill = 0;
  #length = FRAME_PREFIX_BYTES;
  readonly #prefix = new Uint8Array(FRAME_PREFIX_BYTES);
  #copy: Uint8Array[] = [];

  constructor(readonly target: number) {}

  /** True when the next byte fed starts a frame. */
  get atFrameStart(): boolean {
    return this.#fill === 0;
  }

  /** Feeds bytes; returns the target frame's bytes once, when it completes. */
  feed(bytes: Uint8Array): Uint8Array[] | null {
    let done: Uint8Array[] | null = null;
    let at = 0;
    while (at < bytes.length) {
      const take = Math.min(this.#length - this.#fill, bytes.length - at);
      const piece = bytes.subarray(at, at + take);
      if (this.#fill < FRAME_PREFIX_BYTES) {
        this.#prefix.set(piece.subarray(0, FRAME_PREFIX_BYTES - this.#fill), this.#fill);
      }
      if (this.#frame === this.target) this.#copy.push(piece.slice());
      this.#fill += take;
      at += take;
      if (this.#fill === FRAME_PREFIX_BYTES && this.#length === FRAME_PREFIX_BYTES) {
        // No ceilings here: the receiver's decoder is what enforces them.
        const p = parseFramePrefix(this.#prefix, {
          headerBytesMax: 2 ** 32,
          payloadBytesMax: 2 ** 32,
        });
        this.#length = FRAME_PREFIX_BYTES + p.headerBytes + p.payloadBytes;
      }
      if (this.#fill === this.#length) {
        if (this.#frame === this.target) done = this.#copy;
        this.#frame++;
        this.#fill = 0;
        this.#length = FRAME_PREFIX_BYTES;
        this.#copy = [];
      }
    }
    return done;
  }
}

/** The header `type` of a frame whose head starts `bytes` (as FrameWriter writes it), or null. */
function _frameType(bytes: Uint8Array): string | null {
  if (bytes.length < FRAME_PREFIX_BYTES) return null;
  try {
    const p = parseFramePrefix(bytes.subarray(0, FRAME_PREFIX_BYTES), {
      headerBytesMax: 2 ** 32,
      payloadBytesMax: 2 ** 32,
    });
    const end = FRAME_PREFIX_BYTES + p.headerBytes;
    if (bytes.length < end) return null;
    const header = unpackMsgpack(bytes.subarray(FRAME_PREFIX_BYTES, end)) as { type?: unknown };
    return typeof header?.type === "string" ? header.type : null;
  } catch {
    return null;
  }
}

/** Wraps the writable of a faulted stream: bytes pass through `plan`'s faults on their way. */
export function faultyWritable(
  inner: WritableStream<Uint8Array>,
  plan: FaultPlan,
  hooks: FaultHooks,
): WritableStream<Uint8Array> {
  const writer = inner.getWriter();
  const random = seededRandom(plan.seed ?? 1);
  const dropBefore = plan.dropConnectionBeforeFrameType;
  // Target -1: only tracks frame boundaries (for dropBefore), never copies.
  const copier = plan.duplicateFrameIndex === undefined && dropBefore === undefined
    ? null
    : new _FrameCopier(plan.duplicateFrameIndex ?? -1);
  let offset = 0;
  let dead = false;
  const cut = plan.dropConnectionAfterBytes ?? plan.endStreamAfterBytes ?? plan.killPeerAfterBytes;
  const put = async (bytes: Uint8Array) => {
    await writer.ready;
    await writer.write(bytes);
  };
  return new WritableStream<Uint8Array>({
    async write(chunk) {
      if (dead) return; // after a cut the sender's bytes go nowhere, like on a dead link
      if (plan.delayMs || plan.delayJitterMs) {
        await new Promise((r) =>
          setTimeout(r, (plan.delayMs ?? 0) + random() * (plan.delayJitterMs ?? 0))
        );
      }
      if (dropBefore !== undefined && copier!.atFrameStart && _frameType(chunk) === dropBefore) {
        dead = true;
        hooks.dropConnection();
        return;
      }
      let bytes = chunk;
      if (cut !== undefined && offset + bytes.length >= cut) {
        bytes = bytes.subarray(0, cut - offset);
        dead = true;
      }
      const corrupt = plan.corruptByteAt;
      if (corrupt !== undefined && corrupt >= offset && corrupt < offset + bytes.length) {
        bytes = bytes.slice();
        bytes[corrupt - offset] ^= 0xff;
      }
      offset += bytes.length;
      if (bytes.length > 0) await put(bytes);
      const again = copier?.feed(bytes);
      if (again) { for (const piece of again) await put(piece); }
      if (!dead) return;
      if (plan.dropConnectionAfterBytes !== undefined) hooks.dropConnection();
      else if (plan.killPeerAfterBytes !== undefined) hooks.killSender();
      else await writer.close().catch(() => {});
    },
    async close() {
      if (!dead) await writer.close();
    },
    async abort() {
      // Deno QUIC turns an abort into a clean end of stream; keep that behaviour.
      if (!dead) await writer.close().catch(() => {});
    },
  });
}

/**
 * Applies `plan` to the outgoing bytes of `raw` (the faulted side). Streams are counted in
 * the order this side opened or accepted them. `hooks` default to closing `raw`.
 */
export function withFaults(
  raw: RawConnection,
  plan: FaultPlan,
  hooks?: Partial<FaultHooks>,
): RawConnection {
  const target = plan.streamIndex ?? 1;
  let index = 0;
  const allHooks: FaultHooks = {
    dropConnection: hooks?.dropConnection ??
      (() => raw.close(CloseCode.faultInjected, "fault: connection dropped")),
    killSender: hooks?.killSender ?? (() => {
      throw new Error("killPeerAfterBytes needs the loopback fake or a real process to kill");
    }),
  };
  assert(
    plan.killPeerAfterBytes === undefined || hooks?.killSender,
    "killPeerAfterBytes is loopback-only",
  );
  const wrap = (channel: ByteChannel | null): ByteChannel | null => {
    if (channel === null || index++ !== target) return channel;
    return {
      readable: channel.readable,
      writable: faultyWritable(channel.writable, plan, allHooks),
    };
  };
  return {
    openChannel: async () => wrap(await raw.openChannel())!,
    acceptChannel: async () => wrap(await raw.acceptChannel()),
    close: (code, reason) => raw.close(code, reason),
    closed: raw.closed,
    serverCertificateSha256: raw.serverCertificateSha256,
    remoteAddress: raw.remoteAddress,
    maxIdleTimeoutMs: raw.maxIdleTimeoutMs,
    datagrams: raw.datagrams,
  };
}
