/**
 * The exact-prefix index of the prefill worker's prefix cache (issue #12): which cached
 * checkpoint holds the longest exact prefix of a prompt, for one tenant.
 *
 * Keys are chained block hashes over token ids: block k's key is SHA-256(tenant salt, key of
 * block k-1, tokens of block k), so a key names a whole prefix, never one block alone. The salt
 * is the tenant id, so one tenant's entry never serves (or, by a hit, reveals) another's. A hit
 * is also checked token by token against the tokens the entry holds, so a hash collision can
 * never serve the wrong state: the match is exact.
 *
 * Entries are checkpoints at block boundaries (`tokens` is a multiple of `blockTokens`): the
 * state of a sequence after exactly those tokens. The value is opaque here (serve/ keeps a
 * llama.cpp sequence snapshot). Bytes are accounted per entry against `prefixCacheBytesMax`;
 * inserting evicts least recently used entries (a hit refreshes) until the new one fits, and an
 * entry larger than the whole budget is refused, never stored. Pure: no I/O, no logging (keys
 * are content-derived and are never shown).
 */
import { UsageError } from "./errors.ts";

export interface PrefixIndexOptions {
  /** Tokens per block: checkpoints sit at multiples of this. */
  blockTokens: number;
  /** Bytes all entries may hold together (0 turns the cache off). */
  prefixCacheBytesMax: number;
}

export interface PrefixEntry<V> {
  tenantId: string;
  /** Tokens the entry is the state of: a multiple of `blockTokens`. */
  tokens: Int32Array;
  bytes: number;
  value: V;
}

export interface PrefixHit<V> {
  entry: PrefixEntry<V>;
  /** Tokens reused (entry.tokens.length). */
  cachedTokens: number;
}

/** Block keys of `tokens` for `tenantId`: key i covers tokens [0, (i + 1) * blockTokens). */
export async function blockKeys(
  tenantId: string,
  tokens: Int32Array,
  blockTokens: number,
  blocks = Math.floor(tokens.length / blockTokens),
): Promise<string[]> {
  const salt = new TextEncoder().encode(tenantId);
  const keys: string[] = [];
  let previous = new Uint8Array(32);
  for (let b = 0; b < blocks; b++) {
    const block = tokens.subarray(b * blockTokens, (b + 1) * blockTokens);
    const bytes = new Uint8Array(4 + salt.length + 32 + block.byteLength);
    new DataView(bytes.buffer).setUint32(0, salt.length, true);
    bytes.set(salt, 4);
    bytes.set(previous, 4 + salt.length);
    bytes.set(new Uint8Array(block.buffer, block.byteOffset, block.byteLength), 36 + salt.length);
    previous = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    keys.push(Array.from(previous, (x) => x.toString(16).padStart(2, "0")).join(""));
  }
  return keys;
}

export class PrefixIndex<V> {
  /** Insertion order is recency order: the first entry is the least recently used. */
  readonly #entries = new Map<string, PrefixEntry<V>>();
  #bytes = 0;
  #evicted = 0;

  /** `onEvict` runs for every entry that leaves (evicted, replaced or cleared): erase it there. */
  constructor(
    readonly options: PrefixIndexOptions,
    readonly onEvict: (entry: PrefixEntry<V>) => void = () => {},
  ) {
    const { blockTokens, prefixCacheBytesMax } = options;
    if (!Number.isInteger(blockTokens) || blockTokens < 1) {
      throw new UsageError(`prefixBlockTokens ${blockTokens} is invalid: use a positive integer`);
    }
    if (!Number.isSafeInteger(prefixCacheBytesMax) || prefixCacheBytesMax < 0) {
      throw new UsageError(
        `prefixCacheBytesMax ${prefixCacheBytesMax} is invalid: use 0 (off) or a byte count`,
      );
    }
  }

  get enabled(): boolean {
    return this.options.prefixCacheBytesMax > 0;
  }

  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Entries evicted to make room so far. */
  get evictedTotal(): number {
    return this.#evicted;
  }

  /**
   * The entry holding the longest exact prefix of `prompt` for `tenantId` that leaves at least
   * `keepTokens` tokens to compute (the request needs the last position's logits), or null.
   */
  async lookup(
    tenantId: string,
    prompt: Int32Array,
    keepTokens = 1,
  ): Promise<PrefixHit<V> | null> {
    if (!this.enabled || this.#entries.size === 0) return null;
    const usable = Math.floor(Math.max(0, prompt.length - keepTokens) / this.options.blockTokens);
    const keys = await blockKeys(tenantId, prompt, this.options.blockTokens, usable);
    for (let b = keys.length - 1; b >= 0; b--) {
      const entry = this.#entries.get(keys[b]);
      if (!entry || entry.tenantId !== tenantId) continue;
      if (!sameTokens(entry.tokens, prompt.subarray(0, entry.tokens.length))) continue;
      this.#entries.delete(keys[b]);
      this.#entries.set(keys[b], entry); // most recently used
      return { entry, cachedTokens: entry.tokens.length };
    }
    return null;
  }

  /**
   * Stores a checkpoint; false when it cannot be kept (cache off, larger than the budget, not at
   * a block boundary). Older entries are evicted, least recently used first, until it fits.
   */
  async insert(entry: PrefixEntry<V>): Promise<boolean> {
    const { blockTokens, prefixCacheBytesMax } = this.options;
    const n = entry.tokens.length;
    if (!this.enabled || n === 0 || n % blockTokens !== 0) return false;
    if (entry.bytes > prefixCacheBytesMax) return false;
    const keys = await blockKeys(entry.tenantId, entry.tokens, blockTokens);
    const key = keys[keys.length - 1];
    const old = this.#entries.get(key);
    if (old) this.#remove(key, old);
    while (this.#bytes + entry.bytes > prefixCacheBytesMax) {
      const [lruKey, lru] = this.#entries.entries().next().value!;
      this.#remove(lruKey, lru);
      this.#evicted++;
    }
    this.#entries.set(key, { ...entry, tokens: entry.tokens.slice() });
    this.#bytes += entry.bytes;
    return true;
  }

  /** Removes every entry (shutdown), running `onEvict` for each. */
  clear(): void {
    for (const [key, entry] of [...this.#entries]) this.#remove(key, entry);
  }

  #remove(key: string, entry: PrefixEntry<V>): void {
    this.#entries.delete(key);
    this.#bytes -= entry.bytes;
    entry.tokens.fill(0);
    this.onEvict(entry);
  }
}

function sameTokens(a: Int32Array, b: Int32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
