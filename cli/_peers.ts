/** Parsing of peer addresses given on the command line: `<node-id>@<host>:<port>`. */
import { InvalidArgumentError } from "commander";
import type { PeerAddress } from "../serve/messages.ts";
import { parseHostPort } from "../serve/node.ts";

export function peerArg(value: string): PeerAddress {
  const at = value.indexOf("@");
  const hp = at > 0 ? parseHostPort(value.slice(at + 1)) : null;
  if (at <= 0 || !hp) {
    throw new InvalidArgumentError(
      `expected <node-id>@<host>:<port> (node id from \`identity show\`), got "${value}"`,
    );
  }
  return { nodeId: value.slice(0, at), host: hp.host, port: hp.port };
}

export function listenArg(value: string): { host: string; port: number } {
  const hp = parseHostPort(value);
  if (!hp) throw new InvalidArgumentError(`expected <host>:<port>, got "${value}"`);
  return hp;
}
