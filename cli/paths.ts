/**
 * Per-user folders: the cache (generated default models, digests) and the state folder (node
 * identity, certificate, trust list). Overridable with SKIPPY_CACHE_DIR / SKIPPY_STATE_DIR.
 */

function home(): string {
  return Deno.env.get("HOME") ?? Deno.env.get("USERPROFILE") ?? ".";
}

/** Where generated models and digest caches live. */
export function cacheDir(): string {
  return Deno.env.get("SKIPPY_CACHE_DIR") ??
    `${Deno.env.get("XDG_CACHE_HOME") ?? `${home()}/.cache`}/skippy-disagg`;
}
