/**
 * Authorization on a worker: which trusted peer may send what. Authentication (transport/
 * auth.ts) proves a peer is in the trust list; its entry's roles (transport/trust.ts) then
 * decide each message:
 *
 * - PrefillRequest, GenerateRequest, CancelRequest: from a `coordinator` (it holds the
 *   client's request and the tenant the client authenticated as);
 * - the two-phase handoff's control messages (ReserveRequest, AbortNotice, ...) and handoff
 *   streams, the decode side of a handoff: from a `prefill` worker;
 * - StatsRequest: from any trusted peer (counts only, no content; an operator asks from
 *   whichever node they are on).
 *
 * A refusal names the role that is missing and how to grant it, never any content.
 */
import { rolesOf, type TrustEntry, type TrustRole } from "../transport/mod.ts";
import { CORE_MESSAGE_TYPES } from "./wire.ts";

/** What a handoff stream needs (the decode side of a handoff). */
export const HANDOFF_STREAM_ROLE: TrustRole = "prefill";

/** The role a control message of `type` needs, or null when any trusted peer may send it. */
export function roleNeededFor(type: string): TrustRole | null {
  if (CORE_MESSAGE_TYPES.has(type)) return "prefill";
  if (type === "PrefillRequest" || type === "GenerateRequest" || type === "CancelRequest") {
    return "coordinator";
  }
  return null;
}

/** One peer's roles on this worker, looked up once per connection. */
export class PeerAuthorization {
  readonly roles: ReadonlySet<TrustRole>;

  constructor(readonly nodeId: string, entry: TrustEntry | undefined) {
    this.roles = rolesOf(entry);
  }

  /** Whether the peer may act as `role`. */
  may(role: TrustRole): boolean {
    return this.roles.has(role);
  }

  /** Null when the peer may send `type`; else the one-line refusal. */
  refusalFor(type: string): string | null {
    const role = roleNeededFor(type);
    return role === null || this.may(role) ? null : this.refusal(role, `send ${type}`);
  }

  /** The refusal for an action that needs `role`: which role is missing, and the fix. */
  refusal(role: TrustRole, action: string): string {
    const has = this.roles.size > 0 ? [...this.roles].join(",") : "none";
    return `Refused: peer ${this.nodeId} may not ${action.slice(0, 60)}: it is not trusted as ` +
      `"${role}" on this worker (its roles: ${has}); to allow it, run here: ` +
      `skippy-disagg trust add <its card> --roles ${[...this.roles, role].join(",")}`;
  }
}
