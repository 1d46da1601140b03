"""The dashboard in a real browser: Debian's chromium, driven over WebDriver (chromedriver,
selenium). Run by scripts/dashboard with GUILDHALL_BIN and SCREENSHOT set.

`guildhall serve` with HTTP and two proxied MCP servers (guildhall itself over stdio: `inner`,
and `flaky`, which cannot start until a file exists); the page loads the swarm (as a tree)
and the supervision tree and the task board (two tasks made before it opened, one blocking
the other), then follows the event stream. Traffic is made through the command
line, an MCP client and signals, and each effect must show on the page within a second of
happening: mail sent before the page opened (from the history; a search finds one, a
click opens its thread: `…-mail.png`), a crash before it opened (an agent's call to a
proxied server that died mid-call, in that agent's timeline with its cause and the
restart: `…-timeline.png`), a message in the mail feed (a click shows its thread
with each recipient's
delivery state, delivered then read; a click on an agent its
inbox), its call in the calls table (with a latency histogram; the feed filtered), an agent connecting (its
dot turns green), a context session changed (its entries, history and a version's diff),
a server killed and restarted by its supervisor (`restarts 1`), a server
whose failed starts open its breaker, a task taken and finished (it moves from open to in
progress to ended, its dependent's blocker shows done, a click shows its history). Two
screenshots are kept (`…-tasks.png`, the board).

Then the page under load: a server with 1,000 agents (a tree) kept busy at 5,000 events/s
(the hidden `serve --bench-agents --bench-load`): the whole swarm shows, the page takes the
stream without its timers stalling for a second, and a message sent meanwhile shows within
a second. A second screenshot (`…-load.png`) is kept.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

BIN = os.environ["GUILDHALL_BIN"]
SCREENSHOT = os.environ.get("SCREENSHOT", "target/dashboard.png")
WITHIN = 1.0  # seconds an effect may take to show


def guildhall(data_dir, *args):
    return subprocess.run([BIN, "--data-dir", data_dir, *args], check=True,
                          capture_output=True, text=True).stdout


def texts(driver, css):
    """The texts of the elements matching `css`, read in one script call: the page re-renders
    its lists as events arrive, so an element found by one WebDriver call may be gone (stale)
    by the next."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", css)


def shown(driver, css, contains, within=WITHIN):
    """Waits up to `within` for an element matching `css` whose text contains `contains`."""
    until = time.monotonic() + within
    while not any(contains in text for text in texts(driver, css)):
        if time.monotonic() > until:
            raise AssertionError(
                f"{contains!r} not shown in {css} within {within}s: {texts(driver, css)}")
        time.sleep(0.02)


def click(driver, css, contains, within=WITHIN):
    """Waits up to `within` for an element matching `css` whose text contains `contains`, and
    clicks it. Finding and clicking happen in one script call, so a re-render between them
    cannot leave a stale element."""
    until = time.monotonic() + within
    while not driver.execute_script(
            "const e = Array.from(document.querySelectorAll(arguments[0]))"
            "  .find(e => e.innerText.includes(arguments[1]));"
            "if (e) { e.click(); return true; } return false;", css, contains):
        if time.monotonic() > until:
            raise AssertionError(
                f"{contains!r} not shown in {css} within {within}s: {texts(driver, css)}")
        time.sleep(0.02)


def servers(data_dir):
    """`guildhall servers list --json`, by name."""
    lines = guildhall(data_dir, "servers", "list", "--json").splitlines()
    return {s["name"]: s for s in map(json.loads, lines)}


def until(what, check, within=30):
    """Waits up to `within` seconds for `check()` to hold (it returns the truthy value)."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within}s")
        time.sleep(0.05)


def write_config(data_dir):
    """`inner`: guildhall serving over stdio; `flaky`: exits at once while `ready` is missing."""
    inner = ["--data-dir", os.path.join(data_dir, "inner"), "serve", "--stdio", "--in-memory",
             "--bench-echo"]
    ready = os.path.join(data_dir, "ready")
    script = f"test -f '{ready}' || {{ echo 'not ready yet' >&2; exit 3; }}; exec \"$0\" \"$@\""
    with open(os.path.join(data_dir, "guildhall.toml"), "w") as config:
        config.write(f"""
[servers.inner]
command = {json.dumps(BIN)}
args = {json.dumps(inner)}
env = {{ RUST_LOG = "off" }}
# guildhall itself, with a data directory inside this one: the operator's own program.
sandbox = {{ enabled = false }}

# A bare rmcp server whose `crash` tool ends its process mid-call.
[servers.floor]
command = {json.dumps(BIN)}
args = ["bench", "mcp-floor"]
env = {{ RUST_LOG = "off" }}
sandbox = {{ enabled = false }}

[servers.flaky]
command = "sh"
args = {json.dumps(["-c", script, BIN, *inner])}
env = {{ RUST_LOG = "off" }}
sandbox = {{ enabled = false }}
""")


def mcp_client(data_dir, agent):
    """`guildhall mcp --agent AGENT`, initialized: the process and a function that makes one
    request and returns its answer."""
    client = subprocess.Popen([BIN, "--data-dir", data_dir, "mcp", "--agent", agent],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    ids = iter(range(1, 1_000))

    def request(method, params):
        message = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
        client.stdin.write(json.dumps(message) + "\n")
        client.stdin.flush()
        while True:
            answer = json.loads(client.stdout.readline())
            if answer.get("id") == message["id"]:
                return answer

    request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "dashboard-test", "version": "1"}})
    client.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    client.stdin.flush()
    return client, request


def browser():
    options = webdriver.ChromeOptions()
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1400,900"]:
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def serve(data_dir, *flags):
    """`guildhall serve` on a loopback port; the process and the dashboard's URL."""
    server = subprocess.Popen([BIN, "--data-dir", data_dir, "serve", "--listen", "127.0.0.1:0",
                               *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    for line in server.stdout:
        if line.startswith("dashboard: "):
            return server, line.split(" ", 1)[1].strip()
    server.kill()
    raise AssertionError("serve prints the dashboard's URL")


def main():
    with tempfile.TemporaryDirectory() as data_dir:
        write_config(data_dir)
        server, url = serve(data_dir)
        try:
            for agent, role in [("tl", "tl"), ("pm", "pm"), ("dev", "dev")]:
                args = ["agents", "register", agent, "--role", role]
                if agent != "tl":
                    args += ["--parent", "tl" if agent == "pm" else "pm"]
                guildhall(data_dir, *args)
            # Tasks made before the page opens: the board shows what is there, not only
            # what happens while it watches.
            guildhall(data_dir, "tasks", "add", "write the schema", "--as", "pm",
                      "--assignee", "dev")
            guildhall(data_dir, "tasks", "add", "wire the api", "--as", "pm",
                      "--blocked-by", "1")
            # And a thread of mail: the history shows it, not only what is sent later.
            order = json.loads(guildhall(data_dir, "send", "--from", "pm", "--to", "dev",
                                         "--subject", "deploy the parser",
                                         "--body", "staging first, then prod"))
            guildhall(data_dir, "send", "--from", "dev", "--reply-to", order["id"],
                      "--subject", "parser deployed", "--body", "staging is green")
            # And a crash: dev calls a proxied tool whose server dies mid-call; its
            # supervisor starts it again.
            until("floor serves", lambda: servers(data_dir)["floor"]["state"] == "running")
            client, request = mcp_client(data_dir, "dev")
            try:
                crashed = request("tools/call", {"name": "mcp__floor__crash", "arguments": {}})
                assert crashed.get("error") or crashed["result"].get("isError"), crashed
                request("tools/call", {"name": "whoami", "arguments": {}})
            finally:
                client.kill()
                client.wait()
            until("floor restarted", lambda: servers(data_dir)["floor"]["starts"] == 2
                  and servers(data_dir)["floor"]["state"] == "running")

            driver = browser()
            try:
                driver.get(url)
                # The swarm as a tree (dev under pm under tl), and the supervision tree.
                shown(driver, "#swarm li[data-agent=tl] li[data-agent=pm] li[data-agent=dev]",
                      "dev", within=10)
                shown(driver, "#supervision li", "send_message", within=10)
                shown(driver, "#live.on", "events", within=10)

                # The task board: both tasks open, the second blocked by the first (a tree).
                shown(driver, "#board ul[data-group=open] li[data-task='1']",
                      "write the schema for dev", within=10)
                shown(driver, "#board li[data-task='2'] li[data-blocker='1']",
                      "blocked by #1 write the schema open")
                # A task moving through its states, live: taken, then done.
                guildhall(data_dir, "tasks", "update", "1", "--status", "in_progress", "--as", "dev")
                shown(driver, "#board ul[data-group=in_progress] li[data-task='1']",
                      "write the schema")
                guildhall(data_dir, "tasks", "update", "1", "--status", "done", "--as", "dev",
                          "--note", "merged")
                shown(driver, "#board ul[data-group=ended] li[data-task='1']", "done")
                shown(driver, "#board li[data-task='2'] li[data-blocker='1']", "done")
                # Its history on click.
                click(driver, "#board li[data-task='1'] > .task", "write the schema")
                shown(driver, "#taskhistory li", "open → in_progress")
                shown(driver, "#taskhistory li", "in_progress → done")
                driver.execute_script(
                    "document.getElementById('tasks-panel').scrollIntoView()")
                driver.save_screenshot(SCREENSHOT.replace(".png", "-tasks.png"))

                # The mail sent before the page opened, from the history; a search finds
                # one message of it; its thread opens with both, and what became of each.
                shown(driver, "#mail li", "dev → pm: parser deployed")
                shown(driver, "#mail li", "pm → dev: deploy the parser")
                driver.execute_script(
                    "const f = document.getElementById('mailsearch'); f.value = 'green';"
                    "f.dispatchEvent(new Event('input'));")
                shown(driver, "#mailcount", "1 found")
                found = texts(driver, "#mail li")
                assert len(found) == 1 and "parser deployed" in found[0], f"searched: {found}"
                click(driver, "#mail li", "dev → pm: parser deployed")
                shown(driver, "#thread li", "staging first, then prod")
                shown(driver, "#thread li", "staging is green")
                shown(driver, "#thread .receipts", "pm: delivered")
                driver.execute_script(
                    "document.getElementById('mail-panel').scrollIntoView()")
                driver.save_screenshot(SCREENSHOT.replace(".png", "-mail.png"))
                driver.execute_script(
                    "const f = document.getElementById('mailsearch'); f.value = '';"
                    "f.dispatchEvent(new Event('input'));")
                shown(driver, "#mail li", "pm → dev: deploy the parser")

                # dev's timeline, after the fact: the crashed call, why, and the restart.
                click(driver, "#swarm li[data-agent=dev] > .name", "dev")
                shown(driver, "#calltree li", "mcp__floor__crash")
                shown(driver, "#calltree li .cause", "floor")
                shown(driver, "#calltree li", "restarted mcp__floor__crash")
                shown(driver, "#calltree li", "whoami ok")
                driver.execute_script(
                    "document.getElementById('timeline-panel').scrollIntoView()")
                driver.save_screenshot(SCREENSHOT.replace(".png", "-timeline.png"))

                # A message: the mail feed shows it, and the call shows in the table.
                guildhall(data_dir, "send", "--from", "pm", "--to", "dev", "--subject",
                          "parse the logs", "--body", "go")
                shown(driver, "#mail li", "pm → dev: parse the logs")
                shown(driver, "#tools tr[data-tool=send_message]", "send_message")
                bars = texts(driver, "#tools tr[data-tool=send_message] td.bars")
                assert bars and bars[0].strip(), f"a latency histogram: {bars}"
                # Click through: the message's thread, with the body its recipient keeps;
                # the recipient's inbox.
                click(driver, "#mail li", "pm → dev: parse the logs")
                shown(driver, "#thread li", "go")
                # What became of it, as its sender sees it: delivered.
                shown(driver, "#thread .receipts", "dev: delivered")
                click(driver, "#swarm li[data-agent=dev] > .name", "dev")
                shown(driver, "#inbox li", "parse the logs")
                # Then read.
                guildhall(data_dir, "inbox", "--agent", "dev", "--take")
                click(driver, "#mail li", "pm → dev: parse the logs")
                shown(driver, "#thread .receipts", "dev: read")
                # The calls feed filtered by what is typed.
                driver.execute_script(
                    "const f = document.getElementById('callfilter'); f.value = 'send_message';"
                    "f.dispatchEvent(new Event('input'));")
                shown(driver, "#calls li", "send_message")
                feed = texts(driver, "#calls li")
                assert all("send_message" in row for row in feed), f"filtered: {feed}"

                # Context: a session appears as it is changed; selected, it shows its entries
                # and history, and a version's diff.
                guildhall(data_dir, "context", "update", "plan", "--as", "pm", "--key", "goal",
                          "--value", '{"ship": "v1", "owner": "pm"}')
                click(driver, "#sessions li[data-session=plan]", "v1 by pm")
                shown(driver, "#entries tr[data-key=goal]", '"ship":"v1"')
                guildhall(data_dir, "context", "update", "plan", "--as", "dev", "--key", "goal",
                          "--strategy", "merge", "--value", '{"ship": "v2"}')
                shown(driver, "#sessions li[data-session=plan]", "v2 by dev")
                shown(driver, "#entries tr[data-key=goal]", '"ship":"v2"')
                click(driver, '#batches li[data-version="2"]', "dev: merge goal")
                shown(driver, "#diff .diff[data-key=goal] .del", '"ship": "v1"')
                shown(driver, "#diff .diff[data-key=goal] .add", '"ship": "v2"')
                kept = [text for text in texts(driver, "#diff pre span") if "owner" in text]
                assert kept and kept[0].startswith(" "), f"unchanged lines are unmarked: {kept}"

                # An agent connects: its dot turns green.
                client = subprocess.Popen([BIN, "--data-dir", data_dir, "mcp", "--agent", "dev"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
                try:
                    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "dashboard-test", "version": "1"}}}
                    client.stdin.write(json.dumps(init) + "\n")
                    client.stdin.flush()
                    client.stdout.readline()
                    shown(driver, "#swarm li[data-agent=dev] > span.ok", "●")
                finally:
                    client.kill()
                    client.wait()

                # A crash: the server `inner` killed, restarted by its supervisor.
                pid = until("inner serves", lambda: servers(data_dir)["inner"].get("pid"))
                os.kill(pid, 9)
                until("inner restarted", lambda: servers(data_dir)["inner"]["starts"] == 2
                      and servers(data_dir)["inner"]["state"] == "running")
                shown(driver, "#supervision li[data-child=inner]", "restarts 1")

                # A breaker opening: `flaky`'s failed starts open its start breaker.
                until("flaky's breaker opens",
                      lambda: servers(data_dir)["flaky"]["breaker"]["state"] == "open")
                shown(driver, "#supervision li[data-child=flaky]", "breaker open")
                driver.execute_script(
                    "document.querySelector('#supervision li[data-child=inner]').scrollIntoView()")
                driver.save_screenshot(SCREENSHOT)
                print(f"ok: dashboard in chromium: swarm tree, supervision, the task board "
                      f"(a task live through its states, blockers, history), mail, calls, "
                      f"a context session and a version's diff, an agent connecting, a crash and restart, a breaker opening; "
                      f"screenshot {SCREENSHOT}")
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(timeout=30)


LOAD_AGENTS, LOAD_RATE = 1_000, 5_000  # events/s
LOAD_SECS = 5  # how long the page is watched under load
MAX_GAP_MS = 1_000  # the longest the page may stop running its timers


def under_load():
    """1,000 agents and 5,000 events/s: the page keeps up without freezing. A timer every
    50 ms notes the longest gap between its runs (a frozen page runs no timers); a message
    sent meanwhile still shows within a second."""
    with tempfile.TemporaryDirectory() as data_dir:
        server, url = serve(data_dir, "--in-memory", "--bench-agents", str(LOAD_AGENTS),
                            "--bench-load", str(LOAD_RATE))
        try:
            driver = browser()
            try:
                driver.get(url)
                shown(driver, "#swarm li[data-agent=tl] li[data-agent=pm-8] li[data-agent=w-988]",
                      "w-988", within=10)
                agents = driver.execute_script(
                    "return document.querySelectorAll('#swarm li[data-agent]').length")
                assert agents == LOAD_AGENTS, f"the swarm shows {agents} agents"
                driver.execute_script(
                    "window.gap = 0; let last = performance.now();"
                    "setInterval(() => { const now = performance.now();"
                    "  window.gap = Math.max(window.gap, now - last); last = now; }, 50);")
                total = lambda: int(driver.execute_script(
                    "return (document.getElementById('rate').title.match(/\\d+/) || [0])[0]"))
                start = until("the page counts events", lambda: total() or None, within=10)
                guildhall(data_dir, "send", "--from", "tl", "--to", "pm-3", "--subject",
                          "still there?", "--body", "under load")
                shown(driver, "#mail li", "tl → pm-3: still there?")
                def taken_since_start():
                    taken = total() - start
                    return taken if taken >= LOAD_RATE * LOAD_SECS * 0.8 else None
                taken = until("the page takes the stream", taken_since_start,
                              within=LOAD_SECS * 4)
                rate = driver.execute_script("return document.getElementById('rate').textContent")
                gap = driver.execute_script("return window.gap")
                assert gap < MAX_GAP_MS, f"the page stopped for {gap:.0f} ms under load"
                driver.save_screenshot(SCREENSHOT.replace(".png", "-load.png"))
                print(f"ok: dashboard under load: {LOAD_AGENTS} agents, {taken} events taken "
                      f"(now {rate}), longest timer gap {gap:.0f} ms, a message shown within 1 s")
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
    under_load()
    sys.exit(0)
