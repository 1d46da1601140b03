// guildhall through the official TypeScript MCP SDK client (`@modelcontextprotocol/sdk`, the
// 2025-11-25 era it speaks): resources listed, read and subscribed to, resource templates,
// prompts listed and fetched. Run by scripts/ts-client with GUILDHALL_BIN and SDK_DIR set.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const sdk = process.env.SDK_DIR + "/node_modules/@modelcontextprotocol/sdk/dist/esm";
const { Client } = await import(sdk + "/client/index.js");
const { StdioClientTransport } = await import(sdk + "/client/stdio.js");
const { ResourceUpdatedNotificationSchema } = await import(sdk + "/types.js");

const INBOX = "guildhall://inbox";
const dataDir = mkdtempSync(join(tmpdir(), "guildhall-ts-"));
const transport = new StdioClientTransport({
  command: process.env.GUILDHALL_BIN,
  args: ["--data-dir", dataDir, "serve", "--stdio", "--agent", "solo"],
  stderr: "ignore",
});
const client = new Client({ name: "guildhall-ts-check", version: "1.0.0" });

// Every `resources/updated` for the inbox, as it arrives.
const updates = [];
let wake = () => {};
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (note) => {
  updates.push(note.params.uri);
  wake();
});
async function nextUpdate() {
  const deadline = Date.now() + 5000;
  while (updates.length === 0) {
    assert.ok(Date.now() < deadline, "an update within 5 s of a send");
    await new Promise((resolve) => {
      wake = resolve;
      setTimeout(resolve, 100);
    });
  }
  return updates.shift();
}

try {
  await client.connect(transport);
  const caps = client.getServerCapabilities();
  assert.ok(caps.resources?.subscribe, "the server offers subscriptions");
  assert.ok(caps.prompts, "the server offers prompts");

  const { resources } = await client.listResources();
  const uris = resources.map((r) => r.uri);
  assert.deepEqual(uris.slice(0, 2), [INBOX, "guildhall://agents"], String(uris));
  const { resourceTemplates } = await client.listResourceTemplates();
  assert.ok(
    resourceTemplates.some((t) => t.uriTemplate.startsWith("guildhall://context/")),
    JSON.stringify(resourceTemplates),
  );

  const empty = JSON.parse((await client.readResource({ uri: INBOX })).contents[0].text);
  assert.equal(empty.unread, 0, JSON.stringify(empty));
  await client.subscribeResource({ uri: INBOX });
  for (let i = 0; i < 5; i++) {
    const sent = await client.callTool({
      name: "send_message",
      arguments: { to: "solo", body: `m${i}` },
    });
    assert.ok(!sent.isError, JSON.stringify(sent));
    assert.equal(await nextUpdate(), INBOX);
  }
  const inbox = JSON.parse((await client.readResource({ uri: INBOX })).contents[0].text);
  assert.equal(inbox.unread, 5, JSON.stringify(inbox));

  // The task board: a task created through its tool shows on the board resource and as
  // its own resource.
  assert.ok(uris.includes("guildhall://tasks"), String(uris));
  const created = await client.callTool({ name: "task_create", arguments: { title: "t1" } });
  assert.ok(!created.isError, JSON.stringify(created));
  const board = JSON.parse((await client.readResource({ uri: "guildhall://tasks" })).contents[0].text);
  assert.equal(board.tasks[0].title, "t1", JSON.stringify(board));
  const task = JSON.parse(
    (await client.readResource({ uri: `guildhall://tasks/${board.tasks[0].id}` })).contents[0].text,
  );
  assert.equal(task.status, "open", JSON.stringify(task));

  // The event stream as a resource: the first read starts keeping events, a read after
  // `next` shows what came since (the client's own call among them).
  assert.ok(uris.includes("guildhall://events"), String(uris));
  const readEvents = async (uri) => JSON.parse((await client.readResource({ uri })).contents[0].text);
  let { next } = await readEvents("guildhall://events");
  const again = await client.callTool({ name: "task_create", arguments: { title: "t2" } });
  assert.ok(!again.isError, JSON.stringify(again));
  const seen = [];
  for (let i = 0; i < 200 && !seen.some((e) => e.event === "completed"); i++) {
    const page = await readEvents(`guildhall://events?after=${next}`);
    seen.push(...page.events);
    next = page.next;
    if (!seen.some((e) => e.event === "completed")) await new Promise((r) => setTimeout(r, 10));
  }
  const call = seen.filter((e) => e.tool === "task_create").map((e) => e.event);
  assert.deepEqual(call, ["invoked", "completed"], JSON.stringify(seen));

  const { prompts } = await client.listPrompts();
  assert.deepEqual(
    prompts.map((p) => p.name),
    ["tech-lead", "project-manager", "worker"],
  );
  const brief = await client.getPrompt({ name: "worker", arguments: { task: "ship it" } });
  assert.ok(brief.messages[0].content.text.includes("ship it"), JSON.stringify(brief));
  console.log(
    `ok: TypeScript SDK: ${uris.length} resources, ${resourceTemplates.length} templates, ` +
      `5 inbox updates heard, its own call read from guildhall://events, ` +
      `${prompts.length} prompts`,
  );
} finally {
  await client.close();
  rmSync(dataDir, { recursive: true, force: true });
}
