/**
 * `trust add | list | remove`: the peers this node accepts. A peer is added by its public key
 * or by its peer card (`skippy-disagg identity show --json` on that node, as text or a file);
 * the card also carries the certificate fingerprint this node pins when connecting to it.
 * `--roles` says what the peer may act as here (coordinator, prefill, decode); an entry
 * without roles may act in every role (see transport/trust.ts), and a notice says so.
 */
import { type Command, InvalidArgumentError } from "commander";
import { UsageError } from "../core/errors.ts";
import { resolveStateDir } from "../transport/state_dir.ts";
import { parseFingerprint } from "../transport/tls.ts";
import {
  legacyRolesNotice,
  parsePeerCard,
  parseTrustRoles,
  TrustList,
  type TrustRole,
} from "../transport/trust.ts";

const STATE_DIR_HELP = "node state directory (default: $XDG_STATE_HOME/skippy-disagg)";
/** A peer card or key file is tiny; refuse to slurp anything large by mistake. */
const PEER_CARD_BYTES_MAX = 64 * 1024;

/** Reads the argument as a file if one exists at that path, else takes it as the text itself. */
async function _cardText(argument: string): Promise<string> {
  let info: Deno.FileInfo | null = null;
  try {
    info = await Deno.stat(argument);
  } catch {
    return argument;
  }
  if (!info.isFile || info.size > PEER_CARD_BYTES_MAX) {
    throw new UsageError(`"${argument}" is not a peer card file`, {
      hint: "pass an ed25519:... key, the JSON of `identity show --json`, or a file holding either",
    });
  }
  return await Deno.readTextFile(argument);
}

/** Commander's parser for `--roles`: the list, or a usage error that names the roles. */
function _rolesArg(value: string): TrustRole[] {
  try {
    return parseTrustRoles(value);
  } catch (error) {
    const e = error as UsageError;
    throw new InvalidArgumentError(`${e.message} (${e.hint})`);
  }
}

/** The roles column: the entry's roles, or that it has none (every role). */
function _roles(entry: { roles?: TrustRole[] }): string {
  return entry.roles ? entry.roles.join(",") : "all (no roles set)";
}

export function register(program: Command): void {
  const trust = program.command("trust").description("manage the peers this node trusts");
  registerAdd(trust);
  registerList(trust);
  registerRemove(trust);
}

interface AddFlags {
  label?: string;
  certificateSha256?: string;
  roles?: TrustRole[];
  stateDir?: string;
}

function registerAdd(trust: Command): void {
  trust
    .command("add <key-or-card>")
    .description(
      "trust a peer: an ed25519:... key, or its `identity show --json` card (text or file)",
    )
    .option("--label <name>", "a name for the peer, shown in logs and `trust list`")
    .option(
      "--certificate-sha256 <hex>",
      "pin this TLS certificate fingerprint when connecting to it",
    )
    .option(
      "--roles <list>",
      "what the peer may act as here: a comma-separated subset of coordinator,prefill,decode " +
        "(a coordinator sends requests; a prefill worker hands state to this decode worker; " +
        "this prefill worker hands off only to decode peers)",
      _rolesArg,
    )
    .option("--state-dir <dir>", STATE_DIR_HELP)
    .action(addPeer);
}

/** `trust add`: saves the entry, then says what it allows and what it lacks. */
async function addPeer(argument: string, flags: AddFlags): Promise<void> {
  const card = parsePeerCard(await _cardText(argument));
  if (flags.label) card.label = flags.label;
  if (flags.certificateSha256) {
    card.certificateSha256 = parseFingerprint(flags.certificateSha256);
  }
  const list = await TrustList.load(resolveStateDir(flags.stateDir));
  const { entry, replaced } = await list.add(card, flags.roles);
  await list.save();
  const label = entry.label ? ` (${entry.label})` : "";
  console.log(
    `${replaced ? "updated" : "trusted"} node ${entry.nodeId}${label} as ${_roles(entry)}`,
  );
  if (!entry.roles) console.log(legacyRolesNotice(1));
  if (!entry.certificateSha256) {
    console.log(
      "note: no certificate fingerprint: this node can accept it, but not connect to it",
    );
  }
}

function registerList(trust: Command): void {
  trust
    .command("list")
    .description("list trusted peers")
    .option("--json", "print JSON", false)
    .option("--state-dir <dir>", STATE_DIR_HELP)
    .action(listPeers);
}

/** `trust list`: a table (or JSON) of the entries, and a notice for those without roles. */
async function listPeers(flags: { json: boolean; stateDir?: string }): Promise<void> {
  const list = await TrustList.load(resolveStateDir(flags.stateDir));
  const entries = list.entries();
  if (flags.json) {
    console.log(JSON.stringify(entries));
    return;
  }
  if (entries.length === 0) {
    console.log("no trusted peers (add one with `skippy-disagg trust add`)");
    return;
  }
  console.log(
    `${"node id".padEnd(18)}${"label".padEnd(20)}${"roles".padEnd(28)}${
      "certificate".padEnd(20)
    }added`,
  );
  for (const e of entries) {
    const pin = e.certificateSha256 ? e.certificateSha256.slice(0, 16) + "..." : "-";
    console.log(
      `${e.nodeId.padEnd(18)}${(e.label ?? "-").padEnd(20)}${_roles(e).padEnd(28)}${
        pin.padEnd(20)
      }${e.addedAt.slice(0, 10)}`,
    );
  }
  const legacy = list.legacyEntries().length;
  if (legacy > 0) console.log(legacyRolesNotice(legacy));
}

function registerRemove(trust: Command): void {
  trust
    .command("remove <node-id>")
    .description("stop trusting a peer")
    .option("--state-dir <dir>", STATE_DIR_HELP)
    .action(removePeer);
}

/** `trust remove`: a usage error when no entry has that node id. */
async function removePeer(nodeId: string, flags: { stateDir?: string }): Promise<void> {
  const list = await TrustList.load(resolveStateDir(flags.stateDir));
  const removed = list.remove(nodeId);
  if (!removed) {
    throw new UsageError(`No trusted peer with node id "${nodeId}"`, {
      hint: "see `skippy-disagg trust list`",
    });
  }
  await list.save();
  console.log(`removed node ${nodeId}${removed.label ? ` (${removed.label})` : ""}`);
}
