"""guildhall through the official Python MCP client, over stdio, in both protocol eras.

Run by scripts/python-client (and so by .ci/run) with GUILDHALL_BIN pointing at the binary:
- `guildhall serve --stdio` directly: list tools, call tools, the error cases;
- two agents launched as two `guildhall mcp` processes sharing one data directory (the first
  starts the background server): a mailbox round trip, a reply in the same thread, shared
  context, and a filtered tool;
- resources: the inbox read as a resource, and a subscription to it told of every new
  message (`resources/subscribe` before 2026-07-28, `subscriptions/listen` since); the
  briefing prompts and a completion;
- launched agents: `spawn_agent` starts fake agents (tests/python/fake_agent.py) that
  connect back through `guildhall mcp` as themselves, claim their task and mail their
  parent; a crashing one is restarted and given up; `stop_agent` leaves no process;
- humans in the loop: `ask_human` and `confirm` answered by this client's user through its
  elicitation callback (before 2026-07-28), and by a configured human through
  `guildhall inbox --human` and `guildhall answer` while the call waits, or later by its
  `pending` id (every era: a client that cannot be asked);
- long calls as tasks (2026-07-28, the `io.modelcontextprotocol/tasks` extension, declared
  with the SDK's ClientExtension): `ask_human` becomes a task, the client disconnects, the
  human answers, the client reconnects and reads the result with `tasks/get`; a `bash`
  task cancelled with `tasks/cancel` kills its command (checked by pid);
- proxied servers: `@modelcontextprotocol/server-everything` and `server-filesystem` (npm)
  and a server written with the Python SDK, configured in guildhall.toml, their tools
  called as `mcp__{server}__{tool}` over stdio and over guildhall's HTTP endpoint (when
  PROXIED_SERVERS names the npm servers' directory); a proxied server's elicitation answered
  by this client's callback through guildhall (before 2026-07-28; since, refused with why);
  server-everything's resources, templates, prompts and completions through guildhall
  (`guildhall://mcp/everything/…`, `mcp__everything__…`) equal to a direct client's, its list
  change and a subscribed resource's update relayed; its HTTP mode restarted mid-call (the
  call fails, the next is served on a new session).
"""

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import warnings

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

BIN = os.environ["GUILDHALL_BIN"]
MODES = ["legacy", "2026-07-28"]
TASK_TOOLS = {"task_create", "task_list", "task_get", "task_update", "task_claim",
              "task_heartbeat", "task_release"}
TOOLS = {"send_message", "check_inbox", "read_message", "mark_read", "message_status", "whoami",
         "list_agents", "set_mode", "context_get", "context_update", "context_history"} | TASK_TOOLS


def params(data_dir, *args):
    return StdioServerParameters(command=BIN, args=["--data-dir", data_dir, *args])


def structured(result):
    assert not result.is_error, result
    # structuredContent is the result; the text block carries the same JSON.
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


async def direct_stdio(mode, data_dir):
    async with Client(params(data_dir, "serve", "--stdio", "--agent", "solo"), mode=mode) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        assert set(names) == TOOLS, names
        assert names == sorted(names), "tools/list is in name order"
        send = next(t for t in (await c.list_tools()).tools if t.name == "send_message")
        assert send.input_schema["type"] == "object" and "body" in send.input_schema["properties"]
        assert send.output_schema is not None

        receipt = structured(await c.call_tool("send_message", {"to": "solo", "body": "note to self"}))
        assert receipt["delivered_to"] == ["solo"]
        inbox = structured(await c.call_tool("check_inbox", {"full": True}))
        assert [m["body"] for m in inbox["messages"]] == ["note to self"]

        # A business error is a tool result the model can read, not a protocol error.
        bad = await c.call_tool("send_message", {"to": "nobody-here", "body": "x"})
        assert bad.is_error and "nobody-here" in bad.content[0].text, bad
        invalid = await c.call_tool("send_message", {"bogus": 1})
        assert invalid.is_error and "bogus" in invalid.content[0].text, invalid
        # An unknown tool is a JSON-RPC error (-32602).
        try:
            await c.call_tool("no_such_tool", {})
        except MCPError as err:
            assert err.error.code == -32602, err
        else:
            raise AssertionError("an unknown tool must be a protocol error")


async def two_agents(mode, data_dir):
    pm = params(data_dir, "mcp", "--agent", "pm-1", "--role", "pm")
    dev = params(data_dir, "mcp", "--agent", "dev-1", "--role", "dev", "--parent", "pm-1",
                 "--tools", "send_message,check_inbox,read_message,context_*")
    async with Client(pm, mode=mode) as p:
        async with Client(dev, mode=mode) as d:
            dev_tools = {t.name for t in (await d.list_tools()).tools}
            assert dev_tools == TOOLS - {"mark_read", "message_status", "whoami", "list_agents",
                                         "set_mode"} - TASK_TOOLS, dev_tools
            me = structured(await p.call_tool("whoami", {}))
            assert me["agent"] == "pm-1" and me["children"] == ["dev-1"], me

            sent = structured(await p.call_tool("send_message", {
                "to": "dev-1", "subject": "task", "body": "build the parser", "priority": "high"}))
            waited = structured(await d.call_tool("check_inbox", {"wait_secs": 5, "full": True}))
            [task] = waited["messages"]
            assert task["from"] == "pm-1" and task["body"] == "build the parser", task
            assert task["priority"] == "high"

            # The dev's identity comes from its connection; `parent` resolves to pm-1.
            reply = structured(await d.call_tool("send_message", {
                "to": "parent", "body": "parser done", "reply_to": task["id"]}))
            assert reply["thread"] == sent["thread"]
            got = structured(await p.call_tool("check_inbox", {"wait_secs": 5, "full": True}))
            [report] = got["messages"]
            assert report["from"] == "dev-1" and report["thread"] == sent["thread"], report
            assert report["subject"] == "Re: task"

            # Shared context: the dev writes, the PM reads, with the dev as author.
            structured(await d.call_tool("context_update", {
                "session": "proj", "changes": [
                    {"key": "status", "value": "parser done", "strategy": "replace"}]}))
            ctx = structured(await p.call_tool("context_get", {"session": "proj", "keys": ["status"]}))
            [entry] = ctx["entries"]
            assert entry["value"] == "parser done" and entry["author"] == "dev-1", entry

            # A tool outside the connection's --tools is refused.
            try:
                await d.call_tool("mark_read", {"ids": [task["id"]]})
            except MCPError as err:
                assert err.error.code == -32602 and "not available" in err.error.message, err
            else:
                raise AssertionError("a filtered tool must be refused")


SENDS = 20
INBOX = "guildhall://inbox"


async def resources(mode, data_dir):
    updates = asyncio.Queue()

    async def on_message(message):
        note = getattr(message, "root", message)
        if getattr(note, "method", "") == "notifications/resources/updated":
            await updates.put(str(note.params.uri))

    server = params(data_dir, "serve", "--stdio", "--agent", "solo")
    async with Client(server, mode=mode, message_handler=on_message) as c:
        uris = [str(r.uri) for r in (await c.list_resources()).resources]
        assert uris[:2] == [INBOX, "guildhall://agents"], uris
        prompts = [p.name for p in (await c.list_prompts()).prompts]
        assert prompts == ["tech-lead", "project-manager", "worker"], prompts
        brief = await c.get_prompt("worker", {"task": "ship it"})
        assert "ship it" in brief.messages[0].content.text, brief

        async def send_and_hear(n, next_update):
            # Each message sent is announced: the subscriber never needs to poll.
            for i in range(n):
                structured(await c.call_tool("send_message", {"to": "solo", "body": f"m{i}"}))
                assert await asyncio.wait_for(next_update(), 5) == INBOX

        if mode == "legacy":
            with warnings.catch_warnings():
                # The SDK warns that the method is gone since 2026-07-28; this is the older era.
                warnings.simplefilter("ignore")
                await c.subscribe_resource(INBOX)
            await send_and_hear(SENDS, updates.get)
        else:
            async with c.listen(resource_subscriptions=[INBOX]) as sub:
                events = aiter(sub)

                async def next_update():
                    return str((await anext(events)).uri)

                # A listen stream starts with one announcement per resource.
                assert await asyncio.wait_for(next_update(), 5) == INBOX
                await send_and_hear(SENDS, next_update)
        read = await c.read_resource(INBOX)
        inbox = json.loads(read.contents[0].text)
        assert inbox["unread"] == SENDS, inbox


PY_SERVER = """
from typing import TypedDict
from mcp.server import MCPServer
from mcp.server.mcpserver import Audio, Image
app = MCPServer("py")

@app.tool()
def add(a: int, b: int) -> int:
    \"\"\"Adds two numbers.\"\"\"
    return a + b

class Weather(TypedDict):
    city: str
    celsius: float

@app.tool()
def weather(city: str) -> Weather:
    \"\"\"Structured content, with the output schema it matches.\"\"\"
    return {"city": city, "celsius": 21.5}

@app.tool()
def picture() -> list:
    \"\"\"An image (320 KiB, as a screenshot is), a sound and a caption.\"\"\"
    return [Image(data=bytes(range(256)) * 1280, format="png"),
            Audio(data=b"RIFF....WAVE", format="wav"), "a picture and a sound"]

@app.tool()
def refuse(why: str) -> str:
    \"\"\"Always fails, with the server's own message.\"\"\"
    from mcp.server.mcpserver.exceptions import ToolError
    raise ToolError(why)

app.run()
"""


def proxied_config(data_dir, root, everything_url):
    """Each server confined (the default), its files beside the data directory: what a
    sandbox never reaches."""
    servers = os.environ["PROXIED_SERVERS"]
    node = os.environ["NODE"]
    py_server = os.path.join(os.path.dirname(data_dir), "py_server.py")
    with open(py_server, "w") as f:
        f.write(PY_SERVER)
    everything = os.path.join(servers, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    filesystem = os.path.join(servers, "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as f:
        f.write(f"""
[servers.everything]
command = {json.dumps(node)}
args = [{json.dumps(everything)}, "stdio"]

[servers.everyhttp]
url = {json.dumps(everything_url)}
# A call in flight when the server restarts (forgetting the session) ends at this deadline.
timeout = "15s"

[servers.fs]
command = {json.dumps(node)}
args = [{json.dumps(filesystem)}, {json.dumps(root)}]
tools = ["read_*", "list_*"]

[servers.py]
command = {json.dumps(sys.executable)}
args = [{json.dumps(py_server)}]

[servers.asker]
command = {json.dumps(BIN)}
args = ["--data-dir", {json.dumps(os.path.join(data_dir, "inner"))}, "serve", "--stdio", "--in-memory", "--conformance-fixtures"]
tools = ["test_elicitation"]
# guildhall itself, with a data directory inside this one: the operator's own program.
sandbox = {{ enabled = false }}
""")


PROXIED = {"mcp__everything__echo", "mcp__everyhttp__echo", "mcp__fs__read_text_file",
           "mcp__py__add", "mcp__py__picture", "mcp__asker__test_elicitation"}

# Loaded into server-everything's Streamable HTTP mode, which listens on every address:
# here it listens on loopback only.
LOOPBACK_ONLY = """
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === "number" || typeof port === "string") {
    return listen.call(this, Number(port), "127.0.0.1", ...rest.filter(a => typeof a === "function"));
  }
  return listen.call(this, port, ...rest);
};
"""


def everything_over_http(base, port=None):
    """server-everything in its Streamable HTTP mode on a free loopback port (or `port`):
    the process and its /mcp URL."""
    import socket
    preload = os.path.join(base, "loopback_only.cjs")
    with open(preload, "w") as f:
        f.write(LOOPBACK_ONLY)
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    everything = os.path.join(os.environ["PROXIED_SERVERS"],
                              "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    server = subprocess.Popen([os.environ["NODE"], "--require", preload, everything, "streamableHttp"],
                              env={**os.environ, "PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if "listening on port" in line:
            break
    else:
        raise AssertionError("server-everything did not start in its HTTP mode")
    # Its log is not read from here on: drained, so it never blocks on a full pipe.
    threading.Thread(target=server.stderr.read, daemon=True).start()
    return server, f"http://127.0.0.1:{port}/mcp"


async def answer_as_ada(context, params):
    """The user behind the client: asked by a proxied server, through guildhall."""
    from mcp import types
    assert "Who are you?" in params.message, params
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def use_proxied(c, root, can_elicit, py_server, everything_url):
    # The servers start beside guildhall; their tools appear as each is ready.
    for _ in range(600):
        names = {t.name for t in (await c.list_tools()).tools}
        if PROXIED <= names:
            break
        await asyncio.sleep(0.1)
    assert PROXIED <= names, names
    assert not any(n.startswith("mcp__fs__write") for n in names), "only the tools asked for"
    echo = await c.call_tool("mcp__everything__echo", {"message": "through guildhall"})
    assert not echo.is_error and "through guildhall" in echo.content[0].text, echo
    text = await c.call_tool("mcp__fs__read_text_file", {"path": os.path.join(root, "note.txt")})
    assert not text.is_error and "proxied" in text.content[0].text, text
    outside = await c.call_tool("mcp__fs__read_text_file", {"path": "/etc/passwd"})
    assert outside.is_error, "the filesystem server's own confinement still holds"
    added = await c.call_tool("mcp__py__add", {"a": 2, "b": 3})
    assert not added.is_error and "5" in added.content[0].text, added
    # A proxied server's question reaches this client's user, and the answer goes back;
    # a client that cannot be asked (the 2026-07-28 era has no server-to-client requests)
    # gets the reason instead.
    asked = await c.call_tool("mcp__asker__test_elicitation", {"message": "Who are you?"})
    if can_elicit:
        assert not asked.is_error and "Ada" in asked.content[0].text, asked
    else:
        assert asked.is_error and "elicitation" in asked.content[0].text, asked
    await proxied_results(c, py_server, everything_url)


# Arguments for the tools of the servers compared below; a tool not named takes none.
EVERYTHING_ARGS = {
    "echo": {"message": "hi"},
    "get-annotated-message": {"messageType": "error", "includeImage": True},
    "get-resource-links": {"count": 3},
    "get-resource-reference": {"resourceType": "Blob", "resourceId": 2},
    "get-structured-content": {"location": "New York"},
    "get-sum": {"a": 2, "b": 3},
    "gzip-file-as-resource": {"name": "a.gz", "data": "data:text/plain;base64,aGVsbG8=",
                              "outputType": "resource"},
    "trigger-long-running-operation": {"duration": 0.2, "steps": 2},
    "simulate-research-query": {"topic": "proxies"},
    "add": {"a": 2, "b": 3},
    "weather": {"city": "Oslo"},
    "refuse": {"why": "the server's own reason"},
}
# What differs by design: guildhall gives a confined server a HOME and TMPDIR of its own.
NOT_COMPARED = {"get-env"}
# Tools that must be called as tasks (2025-11-25 `taskSupport: "required"`), which this
# client does not do directly: through guildhall they answer, guildhall following the task.
TASKS_REQUIRED = {"simulate-research-query"}


SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# A clock time in a resource server-everything makes on each call ("created at 9:52:51
# PM"): the direct call and the proxied one may straddle a second.
CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\s?[AP]M)?|\d{4}-\d{2}-\d{2}T[0-9:.]+Z?")


def result_view(result):
    """A tool result as the client got it, every field that a proxy could lose; a session
    id in a text (server-everything names its HTTP session) as a placeholder, and a clock
    time in an embedded resource too."""
    content = [b.model_dump(exclude_none=True, by_alias=True) for b in result.content]
    for block in content:
        if block["type"] == "text":
            block["text"] = SESSION_ID.sub("<session>", block["text"])
        if block["type"] == "resource":
            resource = block["resource"]
            if "text" in resource:
                resource["text"] = CLOCK.sub("<time>", resource["text"])
            if "blob" in resource:
                try:
                    decoded = base64.b64decode(resource["blob"]).decode()
                except (ValueError, UnicodeDecodeError):
                    continue
                resource["blob"] = "decoded: " + CLOCK.sub("<time>", decoded)
    return {"content": content, "structured": result.structured_content,
            "is_error": result.is_error, "meta": result.meta}


async def same_as_direct(c, direct, server):
    """Every tool of `direct` (a client of the server itself), called through guildhall as
    `mcp__{server}__{tool}` with the same arguments, answers exactly what the server does:
    every content block with its annotations, structured content, isError, _meta."""
    listed = {t.name for t in (await c.list_tools()).tools}
    compared = 0
    for tool in (await direct.list_tools()).tools:
        if tool.name in NOT_COMPARED:
            continue
        name = f"mcp__{server}__{tool.name}"
        assert name in listed, (name, sorted(listed))
        args = EVERYTHING_ARGS.get(tool.name, {})
        want = result_view(await direct.call_tool(tool.name, args))
        got = result_view(await c.call_tool(name, args))
        if tool.name in TASKS_REQUIRED:
            assert want["is_error"] and "requires task augmentation" in str(want), want
            [report] = got["content"]
            assert not got["is_error"] and "# Research Report: proxies" in report["text"], got
            assert "Stage 4: Generating report" in report["text"], got
            compared += 1
            continue
        assert got == want, (name, json.dumps(got)[:2000], json.dumps(want)[:2000])
        compared += 1
    return compared


async def same_as_everything_direct(c, server, url=None):
    """As `same_as_direct`, against server-everything over stdio, or at `url` (its HTTP
    mode, the very server guildhall proxies, in a session of its own)."""
    if url:
        from mcp.client.streamable_http import streamable_http_client
        transport = streamable_http_client(url)
    else:
        everything = os.path.join(os.environ["PROXIED_SERVERS"],
                                  "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        transport = StdioServerParameters(command=os.environ["NODE"], args=[everything, "stdio"])
    # The reference server speaks the older era: compared with it directly in that one.
    async with Client(transport, mode="legacy") as direct:
        return await same_as_direct(c, direct, server)


async def proxied_results(c, py_server, everything_url):
    """Results pass through whole: server-everything's every tool, over stdio and over its
    Streamable HTTP mode, and the Python server's image, audio, structured content and
    error; a guildhall error says it is guildhall's in `_meta`, a server's does not."""
    assert await same_as_everything_direct(c, "everything") >= 12
    assert await same_as_everything_direct(c, "everyhttp", everything_url) >= 12
    async with Client(StdioServerParameters(command=sys.executable, args=[py_server]),
                      mode="legacy") as direct:
        assert await same_as_direct(c, direct, "py") == 4
    picture = await c.call_tool("mcp__py__picture", {})
    image, sound, caption = picture.content
    assert (image.type, image.mime_type, sound.type, caption.text) == (
        "image", "image/png", "audio", "a picture and a sound"), picture
    assert len(image.data) > 400_000, "the image is whole, not cut as text would be"
    refused = await c.call_tool("mcp__py__refuse", {"why": "no"})
    assert refused.is_error and "guildhall/error" not in (refused.meta or {}), refused
    # A server's error text is bounded as guildhall's own are: cut at 8 KiB, saying so.
    long = await c.call_tool("mcp__py__refuse", {"why": "x" * 100_000})
    [text] = long.content
    assert long.is_error and len(text.text) < 9000 and "more bytes cut" in text.text, text.text[:300]
    bad = await c.call_tool("check_inbox", {"wait_secs": "soon"})
    assert bad.is_error and (bad.meta or {}).get("guildhall/error") == "invalid_arguments", bad


# server-everything stamps its dynamic resources with the time of the read.
CLOCK = re.compile(r"\d{1,2}:\d{2}:\d{2}( [AP]M)?")
FEDERATED = "guildhall://mcp/everything/"


def dump(item):
    return item.model_dump(mode="json", exclude_none=True, by_alias=True)


def contents_view(result, prefix=""):
    """A read's contents as the client got them, each `uri` as the server names it (less
    `prefix`), the clock in a text or blob as a placeholder."""
    import base64
    contents = []
    for item in result.contents:
        item = dump(item)
        assert item["uri"].startswith(prefix), (item["uri"], prefix)
        item["uri"] = item["uri"][len(prefix):]
        if "text" in item:
            item["text"] = CLOCK.sub("<time>", item["text"])
        if "blob" in item:
            item["blob"] = CLOCK.sub("<time>", base64.b64decode(item["blob"]).decode(errors="replace"))
        contents.append(item)
    return contents


async def listed_all(list_page, key):
    """Every page of a listing."""
    items, cursor = [], None
    for _ in range(100):
        page = await list_page(cursor)
        items += getattr(page, key)
        cursor = page.next_cursor
        if not cursor:
            return items
    raise AssertionError(f"{key}: more than 100 pages")


async def federated(c, mode, notes):
    """server-everything's resources, templates, prompts and completions through guildhall,
    under `guildhall://mcp/everything/…` and `mcp__everything__…`: each listed and answered as
    the server answers directly; a subscribed resource's update relayed."""
    everything = os.path.join(os.environ["PROXIED_SERVERS"],
                              "node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    direct_server = StdioServerParameters(command=os.environ["NODE"], args=[everything, "stdio"])
    async with Client(direct_server, mode="legacy") as direct:
        # Resources: each one the server lists is listed through guildhall, the same but for
        # its URI, and reads the same.
        mine = {str(r.uri): dump(r) for r in await listed_all(
            lambda cur: c.list_resources(cursor=cur), "resources")}
        theirs = await listed_all(lambda cur: direct.list_resources(cursor=cur), "resources")
        assert len(theirs) >= 7, theirs
        for resource in theirs:
            want = dump(resource)
            want["uri"] = FEDERATED + want["uri"]
            assert mine.get(want["uri"]) == want, (want, sorted(mine))
            got = await c.read_resource(want["uri"])
            assert contents_view(got, FEDERATED) == contents_view(
                await direct.read_resource(str(resource.uri))), want["uri"]
        # Templates, and a templated read.
        mine = {t.uri_template: dump(t) for t in await listed_all(
            lambda cur: c.list_resource_templates(cursor=cur), "resource_templates")}
        theirs = await listed_all(lambda cur: direct.list_resource_templates(cursor=cur),
                                  "resource_templates")
        assert len(theirs) >= 2, theirs
        for template in theirs:
            want = dump(template)
            want["uriTemplate"] = FEDERATED + want["uriTemplate"]
            assert mine.get(want["uriTemplate"]) == want, (want, sorted(mine))
        dynamic = "demo://resource/dynamic/text/3"
        assert contents_view(await c.read_resource(FEDERATED + dynamic), FEDERATED) == \
            contents_view(await direct.read_resource(dynamic))
        try:
            await c.read_resource(FEDERATED + "demo://no/such/thing")
            raise AssertionError("an unknown resource is an error")
        except MCPError as err:
            assert "demo://no/such/thing" in str(err), err
        # Prompts: listed under guildhall's names, got with the server's own answers.
        mine = {p.name: dump(p) for p in await listed_all(
            lambda cur: c.list_prompts(cursor=cur), "prompts")}
        theirs = (await direct.list_prompts()).prompts
        assert len(theirs) >= 4, theirs
        args = {"args-prompt": {"city": "Oslo"},
                "completable-prompt": {"department": "Engineering", "name": "Alice"},
                "resource-prompt": {"resourceType": "Text", "resourceId": "2"}}
        for prompt in theirs:
            want = dump(prompt)
            want["name"] = "mcp__everything__" + want["name"]
            assert mine.get(want["name"]) == want, (want, sorted(mine))
            got = await c.get_prompt(want["name"], args.get(prompt.name, {}))
            expected = await direct.get_prompt(prompt.name, args.get(prompt.name, {}))
            assert CLOCK.sub("", json.dumps(dump(got))) == CLOCK.sub("", json.dumps(dump(expected))), prompt.name
        # Completions, of a prompt's argument and of a template's variable.
        from mcp.types import PromptReference, ResourceTemplateReference
        got = await c.complete(PromptReference(type="ref/prompt", name="mcp__everything__completable-prompt"),
                               {"name": "department", "value": "S"})
        expected = await direct.complete(PromptReference(type="ref/prompt", name="completable-prompt"),
                                         {"name": "department", "value": "S"})
        assert got.completion.values == expected.completion.values == ["Sales", "Support"], got
        template = theirs_template = "demo://resource/dynamic/text/{resourceId}"
        got = await c.complete(ResourceTemplateReference(type="ref/resource", uri=FEDERATED + template),
                               {"name": "resourceId", "value": "1"})
        expected = await direct.complete(ResourceTemplateReference(type="ref/resource", uri=theirs_template),
                                         {"name": "resourceId", "value": "1"})
        assert got.completion.values == expected.completion.values, (got, expected)
    # A resource the server adds: its list_changed reaches this client, and the listing has
    # it under guildhall's URI.
    added = FEDERATED + "demo://resource/session/federated.gz"
    gzip = {"name": "federated.gz", "data": "data:text/plain;base64,aGVsbG8=",
            "outputType": "resourceLink"}

    async def listed_after_change():
        # Other servers' changes may be heard first: each one heard, the list is read again.
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if await asyncio.wait_for(notes.get(), max(left, 0.1)) != (
                    "notifications/resources/list_changed", None):
                continue
            uris = {str(r.uri) for r in await listed_all(lambda cur: c.list_resources(cursor=cur), "resources")}
            if added in uris:
                return

    while not notes.empty():
        notes.get_nowait()

    if mode == "legacy":
        assert not (await c.call_tool("mcp__everything__gzip-file-as-resource", gzip)).is_error
        await listed_after_change()
    else:
        async with c.listen(resources_list_changed=True) as sub:
            events = aiter(sub)
            assert not (await c.call_tool("mcp__everything__gzip-file-as-resource", gzip)).is_error
            await asyncio.wait_for(anext(events), 10)
            await notes.put(("notifications/resources/list_changed", None))
            await listed_after_change()
    # A subscription: the server's update of the resource reaches this client under
    # guildhall's URI (server-everything sends them while its updates are toggled on).
    uri = FEDERATED + "demo://resource/dynamic/text/1"

    async def updates(on):
        # A toggle: the tools compared above may have left it either way. Each toggle
        # follows another call, so the loop guard never takes them for a loop.
        for _ in range(2):
            assert not (await c.call_tool("whoami", {})).is_error
            said = (await c.call_tool("mcp__everything__toggle-subscriber-updates", {})).content[0].text
            if said.startswith("Started" if on else "Stopped"):
                return
        raise AssertionError(f"server-everything's updates not toggled: {said}")

    if mode == "legacy":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await c.subscribe_resource(uri)
        await updates(True)
        try:
            while await asyncio.wait_for(notes.get(), 15) != ("updated", uri):
                pass
        finally:
            await updates(False)
    else:
        async with c.listen(resource_subscriptions=[uri]) as sub:
            events = aiter(sub)
            # A listen stream starts with one announcement per resource; the next is the
            # server's.
            assert str((await asyncio.wait_for(anext(events), 5)).uri) == uri
            await updates(True)
            try:
                assert str((await asyncio.wait_for(anext(events), 15)).uri) == uri
            finally:
                await updates(False)


def note_queue():
    """A queue of the notifications a client hears, as (kind, uri), and its handler."""
    notes = asyncio.Queue()

    async def on_message(message):
        note = getattr(message, "root", message)
        method = getattr(note, "method", "")
        if method == "notifications/resources/updated":
            await notes.put(("updated", str(note.params.uri)))
        elif method.endswith("/list_changed"):
            await notes.put((method, None))

    return notes, on_message


async def proxied(mode, base):
    data_dir = os.path.join(base, "data")
    root = os.path.join(base, "root")
    os.makedirs(data_dir)
    os.makedirs(root)
    with open(os.path.join(root, "note.txt"), "w") as f:
        f.write("proxied file")
    everyhttp, url = everything_over_http(base)
    running = [everyhttp]

    def restart_http():
        """Kills server-everything's HTTP mode and starts it again on its port: a server
        that forgot every session."""
        running[0].kill()
        running[0].wait(timeout=30)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        running[0] = everything_over_http(base, port)[0]

    try:
        await proxied_with(mode, base, data_dir, root, url, restart_http)
    finally:
        running[0].terminate()
        running[0].wait(timeout=30)


async def session_renewed(c, restart_http):
    """server-everything's HTTP mode restarted on its port has forgotten guildhall's
    session: a call in flight when it went away fails (at its deadline; it is never
    replayed), and the next calls are answered on a new session."""
    started = asyncio.Event()

    async def on_progress(progress, total, message):
        started.set()

    long = asyncio.create_task(c.call_tool(
        "mcp__everyhttp__trigger-long-running-operation", {"duration": 60, "steps": 60},
        progress_callback=on_progress))
    await asyncio.wait_for(started.wait(), 20)
    restart_http()
    lost = await asyncio.wait_for(long, 45)
    assert lost.is_error, lost
    for _ in range(300):
        echo = await c.call_tool("mcp__everyhttp__echo", {"message": "new session"})
        if not echo.is_error:
            break
        await asyncio.sleep(0.1)
    assert not echo.is_error and "new session" in echo.content[0].text, echo


async def proxied_with(mode, base, data_dir, root, everything_url, restart_http):
    proxied_config(data_dir, root, everything_url)
    py_server = os.path.join(base, "py_server.py")
    can_elicit = mode == "legacy"
    notes, on_message = note_queue()
    async with Client(params(data_dir, "serve", "--stdio", "--in-memory", "--agent", "solo"), mode=mode,
                      elicitation_callback=answer_as_ada, message_handler=on_message) as c:
        await use_proxied(c, root, can_elicit, py_server, everything_url)
        await federated(c, mode, notes)
        await session_renewed(c, restart_http)

    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    server = subprocess.Popen([BIN, "--data-dir", data_dir, "serve", "--in-memory", "--listen", "127.0.0.1:0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        for line in server.stdout:
            if "http://" in line:
                url = line[line.index("http://"):].split()[0]
                break
        assert url, "serve prints its URL"
        # The SDK's own timeouts (a long read: the GET stream of server notifications is
        # quiet for long stretches). With a bare client's 5 s read timeout that stream closed
        # after each quiet spell, and a list_changed sent before it reopened was lost.
        http = httpx2.AsyncClient(headers={"Guildhall-Agent": "web"},
                                  timeout=httpx2.Timeout(30, read=300))
        notes, on_message = note_queue()
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          elicitation_callback=answer_as_ada, message_handler=on_message) as c:
            await use_proxied(c, root, can_elicit, py_server, everything_url)
            await federated(c, mode, notes)
    finally:
        server.terminate()
        server.wait(timeout=30)


FAKE_AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_agent.py")


def process_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def mail_until(c, count):
    """The tech lead's next `count` messages, waiting for each (bounded)."""
    got = []
    for _ in range(30):
        inbox = structured(await c.call_tool("check_inbox", {"wait_secs": 2, "full": True}))
        if inbox["messages"]:
            got += inbox["messages"]
            structured(await c.call_tool("mark_read", {"ids": [m["id"] for m in inbox["messages"]]}))
        if len(got) >= count:
            return got
    raise AssertionError(f"expected {count} messages, got {got}")


async def launched(mode, data_dir):
    """A tech lead launches fake agents (Python, the MCP SDK) through spawn_agent: one
    claims the task it was given, finishes it and mails its parent; a crashing one is
    restarted, then given up and reported; stop_agent leaves no process behind."""
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as config:
        config.write(f"""[launch.profiles.fake]
command = [{json.dumps(sys.executable)}, {json.dumps(FAKE_AGENT)}, "{{mcp_config}}", "{{prompt}}"]
max_restarts = 1
""")
    tl = params(data_dir, "mcp", "--agent", "tl", "--role", "tl")
    async with Client(tl, mode=mode) as c:
        task = structured(await c.call_tool("task_create", {"title": "parse the logs"}))
        w1 = structured(await c.call_tool("spawn_agent", {
            "role": "dev", "id": "w1", "task": task["id"], "prompt": "work"}))
        assert w1["parent"] == "tl" and w1["state"] == "running", w1
        # Its own report, the board's notice that the task is done, and its exit.
        mail = await mail_until(c, 3)
        subjects = sorted(m["subject"] for m in mail)
        assert subjects == ["agent w1 exited", f"done task {task['id']}",
                            f"task {task['id']} done: parse the logs"], mail
        exited = next(m for m in mail if m["subject"] == "agent w1 exited")
        assert exited["from"] == "w1" and exited["payload"]["exit_code"] == 0, exited
        done = structured(await c.call_tool("task_get", {"id": task["id"]}))
        assert done["status"] == "done" and done["notes"][-1]["text"] == "done by w1", done

        structured(await c.call_tool("spawn_agent", {"role": "dev", "id": "w2", "prompt": "crash"}))
        mail = await mail_until(c, 3)
        assert [m["subject"] for m in mail] == [
            "agent w2 exited", "agent w2 exited", "agent w2 gave up"], mail
        assert mail[0]["payload"]["exit_code"] == 1, mail

        w3 = structured(await c.call_tool("spawn_agent", {"role": "dev", "id": "w3", "prompt": "hang"}))
        stopped = structured(await c.call_tool("stop_agent", {"id": "w3"}))
        assert stopped["state"] == "ended", stopped
        for _ in range(200):
            if process_gone(w3["pid"]):
                break
            await asyncio.sleep(0.05)
        assert process_gone(w3["pid"]), f"w3's process {w3['pid']} outlived stop_agent"
    status = json.loads(subprocess.run([BIN, "--data-dir", data_dir, "status", "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    states = {a["agent"]: a["state"] for a in status["launched"]}
    assert states == {"w1": "ended", "w2": "gave_up", "w3": "ended"}, status["launched"]


async def guildhall(data_dir, *args):
    """Runs the guildhall command without blocking the event loop (a call is waiting)."""
    proc = await asyncio.create_subprocess_exec(
        BIN, "--data-dir", data_dir, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, (args, err.decode())
    return out.decode()


async def answer_question(data_dir, subject, text):
    """Ada, at her terminal: waits for the question in her inbox, then answers it."""
    for _ in range(200):
        listed = [json.loads(line) for line in
                  (await guildhall(data_dir, "inbox", "--human", "--json")).splitlines()]
        question = next((m for m in listed if m["subject"] == subject), None)
        if question:
            said = await guildhall(data_dir, "answer", question["id"], text)
            assert said.strip() == f"answered {question['id']} as ada", said
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no question `{subject}` reached ada")


async def humans(mode, data_dir):
    """ask_human and confirm, answered by the caller's own user (elicitation) or by a human
    of `[humans]` through the command line."""
    from mcp import types
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as config:
        config.write('[humans]\nids = ["ada"]\n')
    asked = []

    async def user(context, params):
        asked.append(params)
        if "deploy" in params.message:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"answer": "postgres"})

    if mode == "legacy":
        tl = params(data_dir, "mcp", "--agent", "tl", "--role", "tl")
        async with Client(tl, mode=mode, elicitation_callback=user) as c:
            got = structured(await c.call_tool("ask_human", {
                "question": "Which database?", "choices": ["postgres", "redb"]}))
            assert got == {"status": "answered", "answer": {"answer": "postgres"}, "by": "client"}, got
            [form] = asked
            assert form.message == "Which database?", form
            assert form.requested_schema["properties"]["answer"]["enum"] == ["postgres", "redb"], form
            no = structured(await c.call_tool("confirm", {"summary": "deploy to production"}))
            assert no["status"] == "declined" and no["by"] == "client", no

    # A client that cannot ask its user (no elicitation callback; none at all since
    # 2026-07-28): the question is mailed to ada, and the call waits for her answer.
    dev = params(data_dir, "mcp", "--agent", "dev", "--role", "dev")
    async with Client(dev, mode=mode) as c:
        assert structured(await c.call_tool("whoami", {}))["agent"] == "dev"
        waiting = asyncio.create_task(c.call_tool("ask_human", {
            "question": "Merge it?", "choices": ["yes", "no"], "wait_secs": 30}))
        await answer_question(data_dir, "question from dev", "yes")
        got = structured(await asyncio.wait_for(waiting, 30))
        assert got == {"status": "answered", "answer": {"answer": "yes"}, "by": "ada"}, got

        # Nobody answers in time: a pending id, and a later call gets the answer.
        pending = structured(await c.call_tool("confirm", {"summary": "drop the table", "wait_secs": 0}))
        assert pending["status"] == "pending", pending
        await answer_question(data_dir, "question from dev", "no")
        got = structured(await c.call_tool("confirm", {"pending": pending["pending"], "wait_secs": 10}))
        assert got["status"] == "answered" and got["confirmed"] is False and got["by"] == "ada", got
    assert len(asked) == (2 if mode == "legacy" else 0), "the dev's questions never reach the tl's user"


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def tasks_extension():
    """The tasks extension as the SDK takes extensions: advertised, and its `task` result
    shape claimed (handed back as is: this test drives tasks/get itself)."""
    from typing import Literal

    from mcp.client.extension import ClientExtension, ResultClaim
    from mcp_types import Result
    from pydantic import Field

    class CreatedTask(Result):
        result_type: Literal["task"] = Field(alias="resultType")
        task_id: str = Field(alias="taskId")
        status: str

    async def unresolved(created, ctx):
        raise AssertionError("called with allow_claimed: the test reads the task itself")

    class Tasks(ClientExtension):
        identifier = TASKS_EXTENSION

        def claims(self):
            return [ResultClaim(result_type="task", model=CreatedTask, resolve=unresolved)]

    return Tasks()


async def task_request(c, method, task_id):
    from mcp_types import Request
    from pydantic import TypeAdapter

    request = Request[dict, str](method=method, params={"taskId": task_id})
    return await c.session.send_request(request, TypeAdapter(dict))


async def task_ended(c, task_id):
    for _ in range(200):
        task = await task_request(c, "tasks/get", task_id)
        if task["status"] in ("completed", "failed", "cancelled"):
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} did not end: {task}")


async def long_calls_as_tasks(data_dir):
    """A question outlives its client's connection as a task; a cancelled task's command is
    killed."""
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as config:
        # The sandbox off: the command's pid is followed from here, outside any PID
        # namespace, and written where the data directory is (which a sandbox covers).
        config.write('[humans]\nids = ["ada"]\n[shell]\ntimeout_secs = 120\n'
                     '[sandbox]\nenabled = false\n')
    dev = params(data_dir, "mcp", "--agent", "dev", "--role", "dev")
    async with Client(dev, mode="2026-07-28", extensions=[tasks_extension()]) as c:
        created = await c.session.call_tool("ask_human", {
            "question": "Ship it on Friday?", "choices": ["yes", "no"], "wait_secs": 300},
            allow_claimed=True)
        assert created.result_type == "task" and created.status == "working", created
        question_task = created.task_id
        # A command that says its pid, then runs until killed.
        pid_file = os.path.join(data_dir, "sleeper.pid")
        created = await c.session.call_tool("bash", {
            "command": f"echo $$ > {pid_file}; exec sleep 300"}, allow_claimed=True)
        assert created.result_type == "task", created
        sleeper = created.task_id
        for _ in range(200):
            if os.path.exists(pid_file) and open(pid_file).read().strip():
                break
            await asyncio.sleep(0.05)
        pid = int(open(pid_file).read())
        ack = await task_request(c, "tasks/cancel", sleeper)
        assert ack.get("resultType") == "complete", ack
        ended = await task_ended(c, sleeper)
        assert ended["status"] == "cancelled", ended
        for _ in range(200):
            if process_gone(pid):
                break
            await asyncio.sleep(0.05)
        assert process_gone(pid), f"the cancelled task's command {pid} still runs"
    # The client is gone; the question still waits. Ada answers.
    await answer_question(data_dir, "question from dev", "yes")
    async with Client(dev, mode="2026-07-28", extensions=[tasks_extension()]) as c:
        done = await task_ended(c, question_task)
        assert done["status"] == "completed", done
        answer = done["result"]["structuredContent"]
        assert answer == {"status": "answered", "answer": {"answer": "yes"}, "by": "ada"}, done


def stop_server(data_dir):
    out = subprocess.run([BIN, "--data-dir", data_dir, "status", "--json"],
                         capture_output=True, text=True)
    if out.returncode == 0:
        os.kill(json.loads(out.stdout)["pid"], signal.SIGTERM)


async def main():
    for mode in MODES:
        with tempfile.TemporaryDirectory() as direct_dir:
            await direct_stdio(mode, direct_dir)
        print(f"ok: serve --stdio, mode={mode}")
        with tempfile.TemporaryDirectory() as shared_dir:
            try:
                await two_agents(mode, shared_dir)
            finally:
                stop_server(shared_dir)
        print(f"ok: two guildhall mcp agents, mode={mode}")
        with tempfile.TemporaryDirectory() as resources_dir:
            await resources(mode, resources_dir)
        print(f"ok: resources, subscriptions and prompts, mode={mode}")
        with tempfile.TemporaryDirectory() as launch_dir:
            try:
                await launched(mode, launch_dir)
            finally:
                stop_server(launch_dir)
        print(f"ok: launched agents connect back, finish a task, crash, stop, mode={mode}")
        with tempfile.TemporaryDirectory() as humans_dir:
            try:
                await humans(mode, humans_dir)
            finally:
                stop_server(humans_dir)
        print(f"ok: ask_human and confirm, by elicitation and by `guildhall answer`, mode={mode}")
        if os.environ.get("PROXIED_SERVERS"):
            with tempfile.TemporaryDirectory() as proxied_dir:
                await proxied(mode, proxied_dir)
            print(f"ok: proxied servers over stdio and HTTP, mode={mode}")
    with tempfile.TemporaryDirectory() as tasks_dir:
        try:
            await long_calls_as_tasks(tasks_dir)
        finally:
            stop_server(tasks_dir)
    print("ok: long calls as tasks: read after a reconnect, cancelled and killed, mode=2026-07-28")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
