/**
 * API keys (`--api-keys <file>`): a JSON object mapping each key to its tenant. The tenant of
 * a request is its authenticated key's, never a field the client sets; it is what
 * `runHandoff` receives as `tenantId`, so it binds the state, the handoff and the records.
 *
 * Keys are compared in constant time (SHA-256 of each, compared with `timingSafeEqual`, every
 * configured key checked whatever matches), and never logged or echoed.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { ApiError } from "./errors.ts";

/** The tenant of every request when the API runs without keys. */
export const UNAUTHENTICATED_TENANT = "default";
/** Bounds on the keys file. */
export const KEYS_MAX = 10_000;
export const KEY_CHARS_MIN = 16;
export const KEY_CHARS_MAX = 512;
export const TENANT_CHARS_MAX = 128;

const digest = (s: string) => createHash("sha256").update(s).digest();

export class ApiKeys {
  #entries: { digest: Uint8Array; tenant: string }[];

  private constructor(entries: { digest: Uint8Array; tenant: string }[]) {
    this.#entries = entries;
  }

  /** Parses a keys file's text; throws an Error that names the entry (never the key). */
  static parse(text: string, source = "API keys file"): ApiKeys {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (error) {
      throw new Error(`Cannot read ${source}: not JSON (${(error as Error).message})`);
    }
    if (typeof json !== "object" || json === null || Array.isArray(json)) {
      throw new Error(`Cannot read ${source}: expected an object {"<key>": "<tenant>"}`);
    }
    const pairs = Object.entries(json as Record<string, unknown>);
    if (pairs.length === 0 || pairs.length > KEYS_MAX) {
      throw new Error(`Cannot read ${source}: it must hold 1 to ${KEYS_MAX} keys`);
    }
    const entries = pairs.map(([key, tenant], i) => {
      if (key.length < KEY_CHARS_MIN || key.length > KEY_CHARS_MAX) {
        throw new Error(
          `Cannot read ${source}: key number ${i + 1} must have ${KEY_CHARS_MIN} to ` +
            `${KEY_CHARS_MAX} characters`,
        );
      }
      if (typeof tenant !== "string" || !/^[A-Za-z0-9._-]{1,128}$/.test(tenant)) {
        throw new Error(
          `Cannot read ${source}: the tenant of key number ${i + 1} must be 1 to ` +
            `${TENANT_CHARS_MAX} characters of A-Z a-z 0-9 . _ -`,
        );
      }
      return { digest: digest(key), tenant };
    });
    return new ApiKeys(entries);
  }

  static async load(path: string): Promise<ApiKeys> {
    return ApiKeys.parse(await Deno.readTextFile(path), `API keys file "${path}"`);
  }

  /** The tenant of `authorization` (`Bearer <key>`); throws a 401 ApiError otherwise. */
  tenantOf(authorization: string | undefined): string {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "");
    if (!match) {
      throw new ApiError(
        401,
        "authentication_error",
        "Missing API key: send the header Authorization: Bearer <key>",
        { code: "invalid_api_key" },
      );
    }
    const given = digest(match[1]);
    let tenant: string | null = null;
    for (const e of this.#entries) {
      if (timingSafeEqual(given, e.digest) && tenant === null) tenant = e.tenant;
    }
    if (tenant === null) {
      throw new ApiError(401, "authentication_error", "Invalid API key", {
        code: "invalid_api_key",
      });
    }
    return tenant;
  }
}
