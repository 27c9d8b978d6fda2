/**
 * How a prefiller's handoff stream ends, per attempt: the manifest, sealed once the
 * reservation's key is known (its frame carries the bytes its tag covers), then the probe
 * digest once the prefiller's own probe decode has run. That decode waits until the manifest
 * has left (`manifestLeft`): on cores the workers share its compute would slow the last bytes of
 * state, and the decoder cannot start its own probe before the manifest is in.
 */
import {
  type BindingContext,
  type FinalManifest,
  type SealedManifest,
  sealManifest,
  signProbeDigest,
  StateValidationError,
  type UnsignedManifest,
} from "../core/mod.ts";

export class StreamEnd {
  #unsigned: UnsignedManifest | null = null;
  #probeDigest: string | null = null;
  #sealed: SealedManifest | null = null;
  #manifestFed = false;
  #probeFed = false;
  readonly #left = Promise.withResolvers<void>();

  /** The exporter's last chunk is out: returns what its probe decode waits for. */
  tailExported(manifest: UnsignedManifest): Promise<void> {
    this.#unsigned = manifest;
    return this.#left.promise;
  }

  /** The prefiller's probe decode finished with this logits digest. */
  probeDone(logitsSha256: string): void {
    this.#probeDigest = logitsSha256;
  }

  /** Once per attempt, when every chunk is fed: the signed manifest to feed (else null). */
  async manifest(binding: BindingContext): Promise<FinalManifest | null> {
    if (this.#unsigned === null || this.#manifestFed) return null;
    this.#manifestFed = true;
    this.#sealed = await sealManifest(this.#unsigned, binding);
    return this.#sealed.manifest;
  }

  /** Once per attempt, after its manifest: the signed probe digest to feed (else null). */
  async probe(
    binding: BindingContext,
    hook?: (logitsSha256: string) => string,
  ): Promise<{ logitsSha256: string; tag: string } | null> {
    if (!this.#manifestFed || this.#probeFed || this.#probeDigest === null) return null;
    this.#probeFed = true;
    const logitsSha256 = hook?.(this.#probeDigest) ?? this.#probeDigest;
    return { logitsSha256, tag: await signProbeDigest(binding, logitsSha256) };
  }

  /** The FinalManifest frame's payload: the bytes `manifest`'s tag covers, as sealed here. */
  payload(manifest: FinalManifest): Uint8Array {
    if (this.#sealed?.manifest !== manifest) {
      throw new StateValidationError("FinalManifest to send was not sealed here");
    }
    return this.#sealed.bytes;
  }

  /** The manifest has left, or the attempt ended: the probe decode may run. */
  manifestLeft(): void {
    this.#left.resolve();
  }

  /** A retry: the manifest and digest are signed again under the new reservation's key. */
  restart(): void {
    this.#manifestFed = this.#probeFed = false;
    this.#sealed = null;
    this.manifestLeft();
  }
}
