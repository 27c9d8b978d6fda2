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
 * Entries are checkpoints: the state of a sequence after exactly `tokens`, at a block boundary
 * or anywhere (a user-turn end of a chat template). An entry is filed under the key of the
 * whole blocks it covers; a `trimmable` entry (dense KV, which can be cut back) is filed under
 * every one of its block keys too and serves any block boundary up to its length. A lookup walks
 * the prompt's block keys from the deepest and takes the longest cover it finds. The value is
 * opaque here (serve/ keeps a llama.cpp sequence snapshot). Bytes are accounted per entry
 * against `prefixCacheBytesMax`; inserting evicts least recently used entries (a hit refreshes)
 * until the new one fits, and an entry larger than the whole budget is refused, never stored.
 * Pure: no I/O, no logging (keys are content-derived and are never shown).
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
  /** Tokens the entry is the state of (at least one). */
  tokens: Int32Array;
  bytes: number;
  value: V;
  /** The state can be cut back to any shorter prefix (dense KV); default false. */
  trimmable?: boolean;
}

export interface PrefixHit<V> {
  entry: PrefixEntry<V>;
  /** Tokens reused: entry.tokens.length, or a block boundary below it for a trimmable entry. */
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

/** The key of no block at all for `tenantId` (entries shorter than one block file under it). */
async function baseKey(tenantId: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(tenantId));
  return Array.from(new Uint8Array(digest), (x) => x.toString(16).padStart(2, "0")).join("");
}

async function tailKey(blocksKey: string, tail: Int32Array): Promise<string> {
  const head = new TextEncoder().encode(blocksKey);
  const bytes = new Uint8Array(head.length + tail.byteLength);
  bytes.set(head);
  bytes.set(new Uint8Array(tail.buffer, tail.byteOffset, tail.byteLength), head.length);
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest), (x) => x.toString(16).padStart(2, "0")).join("");
}

interface Filed<V> {
  entry: PrefixEntry<V>;
  /** Block keys the entry is filed under (one, or every block's for a trimmable entry). */
  under: string[];
}

export class PrefixIndex<V> {
  /** By entry key; insertion order is recency order: the first is the least recently used. */
  readonly #entries = new Map<string, Filed<V>>();
  /** Block key -> keys of the entries filed under it. */
  readonly #byBlock = new Map<string, Set<string>>();
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
    // No shortcut on an empty index: a miss costs the same whatever other tenants cached.
    if (!this.enabled) return null;
    const B = this.options.blockTokens;
    const limit = Math.max(0, prompt.length - keepTokens);
    const keys = [
      await baseKey(tenantId),
      ...await blockKeys(tenantId, prompt, B, Math.floor(limit / B)),
    ];
    for (let b = keys.length - 1; b >= 0; b--) {
      let best: { key: string; filed: Filed<V>; cover: number } | null = null;
      for (const key of this.#byBlock.get(keys[b]) ?? []) {
        const filed = this.#entries.get(key)!;
        const e = filed.entry;
        if (e.tenantId !== tenantId) continue;
        const n = e.tokens.length;
        let cover = 0;
        if (n <= limit && sameTokens(e.tokens, prompt.subarray(0, n))) cover = n;
        else if (e.trimmable && b > 0) {
          if (sameTokens(e.tokens.subarray(0, b * B), prompt.subarray(0, b * B))) cover = b * B;
        }
        if (cover > 0 && (!best || cover > best.cover)) best = { key, filed, cover };
      }
      if (best) {
        this.#entries.delete(best.key);
        this.#entries.set(best.key, best.filed); // most recently used
        return { entry: best.filed.entry, cachedTokens: best.cover };
      }
    }
    return null;
  }

  /**
   * Stores a checkpoint; false when it cannot be kept (cache off, empty, larger than the
   * budget). Older entries are evicted, least recently used first, until it fits; an entry of
   * the same tokens is replaced.
   */
  async insert(entry: PrefixEntry<V>): Promise<boolean> {
    const { blockTokens: B, prefixCacheBytesMax } = this.options;
    const n = entry.tokens.length;
    if (!this.enabled || n === 0) return false;
    if (entry.bytes > prefixCacheBytesMax) return false;
    const keys = [
      await baseKey(entry.tenantId),
      ...await blockKeys(entry.tenantId, entry.tokens, B),
    ];
    const top = keys[keys.length - 1];
    // One entry per exact token sequence: its whole blocks' key chained with the tokens past
    // them (hashed, so no token ids outlive the entry in a key).
    const key = n % B === 0 ? top : await tailKey(top, entry.tokens.subarray(n - (n % B)));
    const old = this.#entries.get(key);
    if (old) this.#remove(key, old);
    while (this.#bytes + entry.bytes > prefixCacheBytesMax) {
      const [lruKey, lru] = this.#entries.entries().next().value!;
      this.#remove(lruKey, lru);
      this.#evicted++;
    }
    const under = entry.trimmable ? keys.slice(1) : [top];
    if (under.length === 0) under.push(top);
    for (const k of under) {
      const set = this.#byBlock.get(k) ?? new Set<string>();
      set.add(key);
      this.#byBlock.set(k, set);
    }
    this.#entries.set(key, { entry: { ...entry, tokens: entry.tokens.slice() }, under });
    this.#bytes += entry.bytes;
    return true;
  }

  /** Removes every entry (shutdown), running `onEvict` for each. */
  clear(): void {
    for (const [key, filed] of [...this.#entries]) this.#remove(key, filed);
  }

  #remove(key: string, filed: Filed<V>): void {
    this.#entries.delete(key);
    for (const k of filed.under) {
      const set = this.#byBlock.get(k);
      set?.delete(key);
      if (set?.size === 0) this.#byBlock.delete(k);
    }
    this.#bytes -= filed.entry.bytes;
    filed.entry.tokens.fill(0);
    this.onEvict(filed.entry);
  }
}

function sameTokens(a: Int32Array, b: Int32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
