"""The dashboard in a real browser: Debian's chromium, driven over WebDriver (chromedriver,
selenium). Run by scripts/dashboard with GUILDHALL_BIN and SCREENSHOT set.

`guildhall serve` with HTTP; the page loads the swarm (as a tree) and the supervision tree,
then follows the event stream. Traffic is made through the command line and an MCP client,
and each effect must show on the page within a second: a message in the mail feed, its
call in the calls table, an agent connecting (its dot turns green). A screenshot is kept.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

BIN = os.environ["GUILDHALL_BIN"]
SCREENSHOT = os.environ.get("SCREENSHOT", "target/dashboard.png")
WITHIN = 1.0  # seconds an effect may take to show


def guildhall(data_dir, *args):
    return subprocess.run([BIN, "--data-dir", data_dir, *args], check=True,
                          capture_output=True, text=True).stdout


def shown(driver, css, contains, within=WITHIN):
    """Waits up to `within` for an element matching `css` whose text contains `contains`."""
    until = time.monotonic() + within
    while True:
        for element in driver.find_elements(By.CSS_SELECTOR, css):
            if contains in element.text:
                return element
        if time.monotonic() > until:
            texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]
            raise AssertionError(f"{contains!r} not shown in {css} within {within}s: {texts}")
        time.sleep(0.02)


def main():
    with tempfile.TemporaryDirectory() as data_dir:
        server = subprocess.Popen([BIN, "--data-dir", data_dir, "serve", "--listen", "127.0.0.1:0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            url = None
            for line in server.stdout:
                if line.startswith("dashboard: "):
                    url = line.split(" ", 1)[1].strip()
                    break
            assert url, "serve prints the dashboard's URL"
            for agent, role in [("tl", "tl"), ("pm", "pm"), ("dev", "dev")]:
                args = ["agents", "register", agent, "--role", role]
                if agent != "tl":
                    args += ["--parent", "tl" if agent == "pm" else "pm"]
                guildhall(data_dir, *args)

            options = webdriver.ChromeOptions()
            for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--window-size=1400,900"]:
                options.add_argument(flag)
            options.binary_location = "/usr/bin/chromium"
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
            try:
                driver.get(url)
                # The swarm as a tree (dev under pm under tl), and the supervision tree.
                shown(driver, "#swarm li[data-agent=tl] li[data-agent=pm] li[data-agent=dev]",
                      "dev", within=10)
                shown(driver, "#supervision li", "send_message", within=10)
                shown(driver, "#live.on", "events", within=10)

                # A message: the mail feed shows it, and the call shows in the table.
                guildhall(data_dir, "send", "--from", "pm", "--to", "dev", "--subject",
                          "parse the logs", "--body", "go")
                shown(driver, "#mail li", "pm → dev: parse the logs")
                shown(driver, "#tools tr[data-tool=send_message]", "send_message")

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
                driver.save_screenshot(SCREENSHOT)
                print(f"ok: dashboard in chromium: swarm tree, supervision, mail, calls, "
                      f"an agent connecting; screenshot {SCREENSHOT}")
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
    sys.exit(0)
