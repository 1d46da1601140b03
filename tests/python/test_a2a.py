"""guildhall at the A2A edge, through the official Python A2A SDK (a2a-sdk from PyPI).

Run by scripts/a2a-clients (and so by .ci/run) with GUILDHALL_BIN pointing at the binary.
One `guildhall serve` exposes `role:tl` over A2A; agent `tl` is a real MCP client (the
Python MCP SDK through `guildhall mcp --agent tl --role tl`) that answers through its
mailbox and the task board. The outside agents are a2a-sdk clients:
- a streamed task: submitted, working with tl's reply, the artifact, completed;
- INPUT_REQUIRED: tl asks (a reply, then `ask_human` about the task), the outside agent
  answers in the same task, tl completes it;
- cancel: the board's task is cancelled; another caller cannot see or cancel it;
- ListTasks: a caller's own tasks;
- calling out: a remote agent written with a2a-sdk (tests/python/a2a_sample_agent.py) is
  the tool `a2a__sample__send`: an answer, an INPUT_REQUIRED round trip, long work sent
  without waiting and followed (and cancelled) with `a2a__sample__task`, killed mid-call
  (the call fails once, the breaker opens), started again (calls are served again).
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import httpx
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    TaskPushNotificationConfig,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from mcp import Client, StdioServerParameters

BIN = os.environ["GUILDHALL_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE = 60.0


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_http(url, process, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            sys.exit(f"{url}: its process ended with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return json.load(answer)
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{url} did not answer within {deadline} s")


def start_sample(port):
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "a2a_sample_agent.py"),
                                str(port)])
    wait_http(f"http://127.0.0.1:{port}/.well-known/agent-card.json", process)
    return process


def message(text, task_id=None, context_id=None):
    m = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=text)])
    if task_id:
        m.task_id = task_id
    if context_id:
        m.context_id = context_id
    return SendMessageRequest(message=m)


def structured(result):
    assert not result.is_error, result
    return result.structured_content


class Tl:
    """Agent tl: a real MCP client answering through its mailbox and the board."""

    def __init__(self, client):
        self.c = client

    async def next_mail(self):
        """The next message from an A2A caller (the board's notices are passed over)."""
        for _ in range(20):
            inbox = structured(await self.c.call_tool(
                "check_inbox", {"wait_secs": 30, "full": True, "limit": 1}))
            assert inbox["messages"], f"tl's inbox stayed empty: {inbox}"
            mail = inbox["messages"][0]
            await self.call("mark_read", {"ids": [mail["id"]]})
            if "a2a" in (mail.get("payload") or {}):
                return mail
        sys.exit("tl received no A2A mail among 20 messages")

    async def call(self, tool, args):
        return structured(await self.c.call_tool(tool, args))


async def streamed_task(base, tl):
    client = await create_client(f"{base}/a2a/role/tl", ClientConfig(streaming=True))
    assert client._card.capabilities.streaming

    async def answer():
        mail = await tl.next_mail()
        task = mail["payload"]["a2a"]["task"]
        assert mail["subject"].startswith(f"A2A task #{task}"), mail
        await tl.call("task_update", {"id": task, "status": "in_progress"})
        await tl.call("send_message", {"to": mail["from"], "reply_to": mail["id"],
                                       "body": "Looking at PR 7 now."})
        await tl.call("task_update", {"id": task, "status": "done",
                                      "note": "PR 7 approved: two nits, both fixed."})
        return task

    answering = asyncio.create_task(answer())
    events = []
    async for event in client.send_message(message("Please review PR 7")):
        events.append(event)
    board_task = await answering
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task", kinds
    assert events[0].task.id == str(board_task)
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED, states
    assert TaskState.TASK_STATE_WORKING in states, states
    said = [e.status_update.status.message.parts[0].text for e in events
            if e.HasField("status_update") and e.status_update.status.HasField("message")]
    assert "Looking at PR 7 now." in said, said
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [a.parts[0].text for a in artifacts] == ["PR 7 approved: two nits, both fixed."]
    got = await client.get_task(GetTaskRequest(id=str(board_task)))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert got.artifacts[0].parts[0].text.startswith("PR 7 approved")
    print(f"streamed: task {board_task} through {len(events)} events to COMPLETED")
    await client.close()
    return str(board_task)


async def input_required(base, tl):
    client = await create_client(f"{base}/a2a/role/tl", ClientConfig(streaming=False))

    async def ask_then_finish():
        mail = await tl.next_mail()
        task = mail["payload"]["a2a"]["task"]
        await tl.call("task_update", {"id": task, "status": "in_progress"})
        await tl.call("send_message", {"to": mail["from"], "reply_to": mail["id"],
                                       "body": "Which branch?",
                                       "payload": {"input_required": True}})
        answer = await tl.next_mail()
        assert answer["body"] == "main", answer
        assert answer["thread"] == mail["thread"], "the answer is in the task's thread"
        await tl.call("task_update", {"id": task, "status": "done", "note": "merged into main"})

    tl_side = asyncio.create_task(ask_then_finish())
    first = [e async for e in client.send_message(message("Merge the release branch"))]
    task = first[-1].task
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task.status
    assert task.status.message.parts[0].text == "Which branch?"
    second = [e async for e in client.send_message(
        message("main", task_id=task.id, context_id=task.context_id))]
    done = second[-1].task
    await tl_side
    assert done.id == task.id
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done.status
    assert done.artifacts[0].parts[0].text == "merged into main"
    history = [(m.role, m.parts[0].text) for m in
               (await client.get_task(GetTaskRequest(id=task.id, history_length=10))).history]
    assert (Role.ROLE_AGENT, "Which branch?") in history, history
    assert (Role.ROLE_USER, "main") in history, history
    print(f"input required: task {task.id} asked, answered in the task, completed")
    await client.close()


async def ask_human_about_the_task(base, tl):
    """tl asks with ask_human about the A2A task: the outside agent is asked, not a human."""
    client = await create_client(f"{base}/a2a/role/tl", ClientConfig(streaming=False))

    async def tl_side():
        mail = await tl.next_mail()
        task = mail["payload"]["a2a"]["task"]
        await tl.call("task_update", {"id": task, "status": "in_progress"})
        answer = await tl.call("ask_human", {"question": "Which region?", "task": task,
                                             "choices": ["eu", "us"], "wait_secs": 30})
        await tl.call("task_update", {"id": task, "status": "done",
                                      "note": f"deployed to {answer['answer']['answer']}"})
        return answer

    asking = asyncio.create_task(tl_side())
    first = [e async for e in client.send_message(message("Deploy the release"))]
    task = first[-1].task
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task.status
    assert task.status.message.parts[0].text.startswith("Which region?"), task.status
    done = [e async for e in client.send_message(
        message("eu", task_id=task.id, context_id=task.context_id))][-1].task
    answer = await asking
    assert answer["by"] == "a2a-remote" and answer["answer"]["answer"] == "eu", answer
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done.status
    assert done.artifacts[0].parts[0].text == "deployed to eu"
    print(f"ask_human: task {task.id}'s caller asked and answered through A2A")
    await client.close()


async def cancel_and_isolation(base, tl, data_dir, earlier):
    client = await create_client(f"{base}/a2a/role/tl",
                                 ClientConfig(streaming=False, polling=True))
    first = [e async for e in client.send_message(message("Rewrite everything in COBOL"))]
    task = first[-1].task
    assert task.status.state == TaskState.TASK_STATE_SUBMITTED, task.status
    await tl.next_mail()
    other = await create_client(f"{base}/a2a/role/tl", ClientConfig(
        streaming=False, httpx_client=httpx.AsyncClient(headers={"guildhall-agent": "mallory"})))
    for attempt in (other.get_task(GetTaskRequest(id=task.id)),
                    other.cancel_task(CancelTaskRequest(id=task.id))):
        try:
            await attempt
        except Exception as err:  # the SDK's TaskNotFoundError
            assert "not found" in str(err).lower(), err
        else:
            sys.exit("another caller reached this caller's task")
    assert (await other.list_tasks(ListTasksRequest())).tasks == []
    cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED, cancelled.status
    board = await tl.call("task_get", {"id": int(task.id)})
    assert board["status"] == "cancelled", board
    mine = await client.list_tasks(ListTasksRequest())
    ids = [t.id for t in mine.tasks]
    assert task.id in ids and earlier in ids, ids
    print(f"cancel: task {task.id} cancelled on the board; another caller sees none of {ids}")
    await client.close()
    await other.close()


class Webhook:
    """A loopback webhook that keeps what is posted to it."""

    def __init__(self):
        posted = self.posted = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posted.append((self.headers.get("A2A-Notification-Token"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    async def until(self, predicate):
        end = time.monotonic() + DEADLINE
        while not predicate(self.posted):
            assert time.monotonic() < end, f"the webhook got only {self.posted}"
            await asyncio.sleep(0.05)


async def push_notifications(base, tl):
    hook = Webhook()
    client = await create_client(f"{base}/a2a/role/tl", ClientConfig(
        streaming=False, polling=True,
        push_notification_config=TaskPushNotificationConfig(url=hook.url, token="s3cret")))
    first = [e async for e in client.send_message(message("Tag release 1.2"))]
    task = first[-1].task
    mail = await tl.next_mail()
    await tl.call("task_update", {"id": int(task.id), "status": "in_progress"})
    await tl.call("task_update", {"id": int(task.id), "status": "done", "note": "tagged v1.2"})

    def completed(posted):
        return any(p.get("statusUpdate", {}).get("status", {}).get("state")
                   == "TASK_STATE_COMPLETED" for _, p in posted)

    await hook.until(completed)
    tokens = {t for t, _ in hook.posted}
    assert tokens == {"s3cret"}, tokens
    kinds = [next(iter(p)) for _, p in hook.posted]
    assert "artifactUpdate" in kinds, kinds
    art = next(p["artifactUpdate"] for _, p in hook.posted if "artifactUpdate" in p)
    assert art["artifact"]["parts"][0]["text"] == "tagged v1.2", art
    print(f"push: {len(hook.posted)} notifications to a loopback webhook, through COMPLETED")
    hook.server.shutdown()
    await client.close()


async def call_out(tl):
    hello = await tl.call("a2a__sample__send", {"text": "hello"})
    assert hello["state"] == "TASK_STATE_COMPLETED" and hello["text"] == "echo: hello", hello
    asked = await tl.call("a2a__sample__send", {"text": "ask"})
    assert asked["state"] == "TASK_STATE_INPUT_REQUIRED" and asked["text"] == "What colour?", asked
    answered = await tl.call("a2a__sample__send",
                             {"text": "blue", "task_id": asked["task_id"],
                              "context_id": asked["context_id"]})
    assert answered["text"] == "answered: blue", answered
    tools = {t.name: t for t in (await tl.c.list_tools()).tools}
    assert "Echo: Says back what it hears." in tools["a2a__sample__send"].description
    # Long work: sent without waiting, followed with the task tool, and one cancelled.
    started = await tl.call("a2a__sample__send", {"text": "sleep 1", "no_wait": True})
    assert started["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), started
    end = time.monotonic() + DEADLINE
    while True:
        followed = await tl.call("a2a__sample__task", {"task_id": started["task_id"]})
        if followed["state"] == "TASK_STATE_COMPLETED":
            assert followed["text"] == "slept", followed
            break
        assert time.monotonic() < end, followed
        await asyncio.sleep(0.2)
    long = await tl.call("a2a__sample__send", {"text": "sleep 30", "no_wait": True})
    cancelled = await tl.call("a2a__sample__task", {"task_id": long["task_id"], "cancel": True})
    assert cancelled["state"] == "TASK_STATE_CANCELED", cancelled
    print("call out: an answer, a question answered in its task, long work followed and "
          "cancelled")


async def killed_mid_call(tl, other, sample, sample_port):
    call = asyncio.create_task(tl.c.call_tool("a2a__sample__send", {"text": "sleep 30"}))
    await asyncio.sleep(1.0)  # the call is in the remote's hands
    os.kill(sample.pid, signal.SIGKILL)
    sample.wait()
    result = await asyncio.wait_for(call, DEADLINE)
    assert result.is_error, result
    text = result.content[0].text
    print(f"killed mid-call: one error: {text[:120]}")
    # While it is down every call fails; from two callers the breaker opens.
    opened = None
    for i in range(12):
        who = tl.c if i % 2 == 0 else other
        result = await who.call_tool("a2a__sample__send", {"text": f"are you there {i}"})
        assert result.is_error, result
        if "circuit" in result.content[0].text.lower():
            opened = i
            break
    assert opened is not None, "the breaker never opened"
    print(f"breaker: open after {opened + 1} failed calls")
    sample = start_sample(sample_port)
    end = time.monotonic() + DEADLINE
    i = 0
    while True:
        result = await tl.c.call_tool("a2a__sample__send", {"text": f"back {i}"})
        if not result.is_error:
            assert result.structured_content["text"] == f"echo: back {i}"
            break
        assert time.monotonic() < end, f"the remote never came back: {result.content[0].text}"
        i += 1
        await asyncio.sleep(0.5)
    print(f"back: served again after {i + 1} calls")
    return sample


async def main():
    work = tempfile.mkdtemp(prefix="guildhall-a2a-")
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir)
    sample_port = free_port()
    sample = start_sample(sample_port)
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as f:
        f.write(f"""
[a2a]
expose = ["role:tl"]
wait = "30s"
push_private = true

[humans]
ids = ["boss"]

[a2a.remote.sample]
url = "http://127.0.0.1:{sample_port}"
timeout = "20s"
""")
    port = free_port()
    server = subprocess.Popen([BIN, "serve", "--data-dir", data_dir, "--listen",
                               f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        card = wait_http(f"{base}/.well-known/agent-card.json", server)
        assert card["name"] == "guildhall role:tl", card
        assert card["supportedInterfaces"][0]["url"] == f"{base}/a2a/role/tl", card

        def bridge(agent, role):
            return StdioServerParameters(command=BIN, args=[
                "--data-dir", data_dir, "mcp", "--agent", agent, "--role", role, "--no-start"])

        async with Client(bridge("tl", "tl"), mode="legacy") as c, \
                Client(bridge("pm", "pm"), mode="legacy") as pm:
            tl = Tl(c)
            earlier = await streamed_task(base, tl)
            await input_required(base, tl)
            await ask_human_about_the_task(base, tl)
            await cancel_and_isolation(base, tl, data_dir, earlier)
            await push_notifications(base, tl)
            await call_out(tl)
            sample = await killed_mid_call(tl, pm, sample, sample_port)
    finally:
        for process in (server, sample):
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
    print("a2a: every check passed")


if __name__ == "__main__":
    asyncio.run(main())
