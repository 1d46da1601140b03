// guildhall at the A2A edge through the official JavaScript A2A SDK (`@a2a-js/sdk`): an
// outside agent streams a task sent to `role:tl` to COMPLETED with its artifact, while agent
// tl (the TypeScript MCP SDK through `guildhall mcp`) answers through its mailbox and the
// board; then a task sent without waiting is read and cancelled. Run by scripts/a2a-clients
// with GUILDHALL_BIN, A2A_JS_DIR and SDK_DIR (the MCP SDK) set.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";

const mcp = process.env.SDK_DIR + "/node_modules/@modelcontextprotocol/sdk/dist/esm";
const { Client: McpClient } = await import(mcp + "/client/index.js");
const { StdioClientTransport } = await import(mcp + "/client/stdio.js");
const a2aDir = process.env.A2A_JS_DIR + "/node_modules/@a2a-js/sdk/dist";
const { ClientFactory } = await import(a2aDir + "/client/index.js");
const { Role, TaskState } = await import(a2aDir + "/index.js");

const BIN = process.env.GUILDHALL_BIN;
const DEADLINE_MS = 60_000;

async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function waitFor(url, child) {
  const end = Date.now() + DEADLINE_MS;
  for (;;) {
    assert.equal(child.exitCode, null, "guildhall serve exited");
    try {
      const answer = await fetch(url);
      if (answer.ok) return await answer.json();
    } catch {
      // not listening yet
    }
    assert.ok(Date.now() < end, `${url} did not answer`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const message = (text, extra = {}) => ({
  message: {
    messageId: randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: text } }],
    ...extra,
  },
});

const dataDir = mkdtempSync(join(tmpdir(), "guildhall-a2a-js-"));
writeFileSync(join(dataDir, "guildhall.toml"), '[a2a]\nexpose = ["role:tl"]\n');
const port = await freePort();
const server = spawn(BIN, ["serve", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`], {
  stdio: ["ignore", "ignore", "inherit"],
});
const base = `http://127.0.0.1:${port}`;
const tl = new McpClient({ name: "tl", version: "1.0.0" });
try {
  await waitFor(`${base}/.well-known/agent-card.json`, server);
  await tl.connect(
    new StdioClientTransport({
      command: BIN,
      args: ["--data-dir", dataDir, "mcp", "--agent", "tl", "--role", "tl", "--no-start"],
      stderr: "ignore",
    }),
  );
  const call = async (name, args) => {
    const result = await tl.callTool({ name, arguments: args });
    assert.ok(!result.isError, JSON.stringify(result));
    return result.structuredContent;
  };
  // The next message from an A2A caller (the board's notices passed over).
  const nextMail = async () => {
    for (let i = 0; i < 20; i++) {
      const inbox = await call("check_inbox", { wait_secs: 30, full: true, limit: 1 });
      assert.ok(inbox.messages.length > 0, "tl's inbox stayed empty");
      const mail = inbox.messages[0];
      await call("mark_read", { ids: [mail.id] });
      if (mail.payload && mail.payload.a2a) return mail;
    }
    assert.fail("tl received no A2A mail");
  };

  const client = await new ClientFactory().createFromUrl(`${base}/a2a/role/tl/`);

  // Streamed to COMPLETED while tl works through its mailbox.
  const answering = (async () => {
    const mail = await nextMail();
    const task = mail.payload.a2a.task;
    await call("task_update", { id: task, status: "in_progress" });
    await call("send_message", { to: mail.from, reply_to: mail.id, body: "On it." });
    await call("task_update", { id: task, status: "done", note: "ship it" });
    return task;
  })();
  const events = [];
  for await (const event of client.sendMessageStream(message("Review the JS client"))) {
    events.push(event);
  }
  const task = await answering;
  const cases = events.map((e) => e.payload.$case);
  assert.equal(cases[0], "task", cases.join());
  assert.equal(events[0].payload.value.id, String(task));
  const states = events
    .filter((e) => e.payload.$case === "statusUpdate")
    .map((e) => e.payload.value.status.state);
  assert.equal(states.at(-1), TaskState.TASK_STATE_COMPLETED, states.join());
  const artifact = events.find((e) => e.payload.$case === "artifactUpdate");
  assert.equal(artifact.payload.value.artifact.parts[0].content.value, "ship it");
  console.log(`js: task ${task} streamed through ${events.length} events to COMPLETED`);

  // Sent without waiting, read, cancelled.
  const sent = await client.sendMessage({
    ...message("Delete the test suite"),
    configuration: { returnImmediately: true },
  });
  assert.equal(sent.status.state, TaskState.TASK_STATE_SUBMITTED);
  await nextMail();
  const got = await client.getTask({ id: sent.id });
  assert.equal(got.id, sent.id);
  const cancelled = await client.cancelTask({ id: sent.id });
  assert.equal(cancelled.status.state, TaskState.TASK_STATE_CANCELED);
  const board = await call("task_get", { id: Number(sent.id) });
  assert.equal(board.status, "cancelled");
  console.log(`js: task ${sent.id} read and cancelled (the board's task too)`);
} finally {
  await tl.close().catch(() => {});
  server.kill("SIGTERM");
  await new Promise((resolve) => server.once("exit", resolve));
}
console.log("a2a js: every check passed");
