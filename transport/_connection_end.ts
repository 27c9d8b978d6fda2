/** Small helpers shared by peer.ts and establish.ts. Private to transport/. */
import { CloseCode, type ConnectionEnd } from "./channel.ts";

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Describes how a connection ended, for error messages. */
export function describeEnd(
  address: string,
  end: ConnectionEnd | null,
  idleMs: number,
  fallback: string,
): string {
  if (end?.timedOut) {
    return `no packets for ${idleMs} ms (idle timeout; the peer died or the network is down)`;
  }
  if (end && end.closeCode !== CloseCode.normal) {
    return `closed by the peer (code ${end.closeCode}: ${end.reason})`;
  }
  if (end) return `closed (${end.reason || "normal close"})`;
  return fallback || `connection to ${address} lost`;
}
