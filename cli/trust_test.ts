import { assert, assertEquals } from "../testing/assert.ts";
import { runCli } from "./program.ts";

Deno.test("identity show --json and trust add/list/remove work on a state dir, exit codes included", async () => {
  const [a, b] = [await Deno.makeTempDir(), await Deno.makeTempDir()];
  const log = console.log;
  const printed: string[] = [];
  console.log = (...args: unknown[]) => printed.push(args.join(" "));
  try {
    assertEquals(await runCli(["identity", "show", "--json", "--state-dir", a]), 0);
    const card = JSON.parse(printed.at(-1)!);
    assert(card.publicKey.startsWith("ed25519:") && card.certificateSha256.length === 64);
    await Deno.writeTextFile(`${a}/card.json`, JSON.stringify(card));
    assertEquals(
      await runCli(["trust", "add", `${a}/card.json`, "--label", "node-a", "--state-dir", b]),
      0,
    );
    assertEquals(await runCli(["trust", "list", "--json", "--state-dir", b]), 0);
    const entries = JSON.parse(printed.at(-1)!);
    assertEquals(entries[0].nodeId, card.nodeId);
    assertEquals(entries[0].certificateSha256, card.certificateSha256);
    assertEquals(await runCli(["trust", "remove", card.nodeId, "--state-dir", b]), 0);
    assertEquals(
      await runCli(["trust", "remove", card.nodeId, "--state-dir", b]),
      2,
      "unknown node id is a usage error",
    );
    assertEquals(await runCli(["trust", "add", "ed25519:nonsense", "--state-dir", b]), 2);
  } finally {
    console.log = log;
    await Deno.remove(a, { recursive: true });
    await Deno.remove(b, { recursive: true });
  }
});

Deno.test("trust add --roles records roles; list shows them; no roles is every role, with a notice", async () => {
  const [a, b] = [await Deno.makeTempDir(), await Deno.makeTempDir()];
  const log = console.log;
  const printed: string[] = [];
  console.log = (...args: unknown[]) => printed.push(args.join(" "));
  try {
    assertEquals(await runCli(["identity", "show", "--json", "--state-dir", a]), 0);
    const card = printed.at(-1)!;
    assertEquals(
      await runCli(["trust", "add", card, "--roles", "prefill,coordinator", "--state-dir", b]),
      0,
    );
    assert(printed.at(-1)!.endsWith("as coordinator,prefill"), printed.at(-1));
    assertEquals(await runCli(["trust", "list", "--json", "--state-dir", b]), 0);
    assertEquals(JSON.parse(printed.at(-1)!)[0].roles, ["coordinator", "prefill"]);
    // Re-adding without --roles keeps them; a bad role is a usage error that changes nothing.
    assertEquals(await runCli(["trust", "add", card, "--state-dir", b]), 0);
    assertEquals(await runCli(["trust", "add", card, "--roles", "admin", "--state-dir", b]), 2);
    assertEquals(await runCli(["trust", "list", "--state-dir", b]), 0);
    assert(printed.at(-1)!.includes("coordinator,prefill"), printed.at(-1));
    // An entry written before roles existed: listed as every role, with the notice.
    const file = JSON.parse(await Deno.readTextFile(`${b}/trust.json`));
    delete file.peers[0].roles;
    await Deno.writeTextFile(`${b}/trust.json`, JSON.stringify(file));
    printed.length = 0;
    assertEquals(await runCli(["trust", "list", "--state-dir", b]), 0);
    assert(printed.some((l) => l.includes("all (no roles set)")), printed.join("\n"));
    assert(printed.at(-1)!.startsWith("note: 1 trusted peer has no roles"), printed.at(-1));
  } finally {
    console.log = log;
    await Deno.remove(a, { recursive: true });
    await Deno.remove(b, { recursive: true });
  }
});
