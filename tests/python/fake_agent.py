"""A fake agent for guildhall's launch tests, as a launch profile starts one:

    command = ["python", "fake_agent.py", "{mcp_config}", "{prompt}"]

It connects back with the official MCP SDK as an MCP client with that config would: the
`guildhall` server entry it names runs `guildhall mcp` with the agent's identity and data
directory (the SDK, like real clients, gives a server only a minimal environment, so the
config carries them). It checks that GUILDHALL_AGENT in its own environment names the same
agent. What it does is its prompt:
- `work`: claim a task, finish it, mail its parent, exit 0;
- `crash`: exit 1 at once;
- `hang`: connect, say so on stdout, and wait until killed.
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters


def structured(result):
    assert not result.is_error, result
    return json.loads(result.content[0].text)


async def main(mcp_config, prompt):
    if prompt == "crash":
        print("crashing on purpose", flush=True)
        sys.exit(1)
    with open(mcp_config) as f:
        server = json.load(f)["mcpServers"]["guildhall"]
    async with Client(StdioServerParameters(command=server["command"], args=server["args"])) as c:
        me = structured(await c.call_tool("whoami", {}))
        assert me["agent"] == os.environ["GUILDHALL_AGENT"], (me, os.environ["GUILDHALL_AGENT"])
        print(f"connected as {me['agent']}", flush=True)
        if prompt == "hang":
            await asyncio.sleep(3600)
            return
        claimed = structured(await c.call_tool("task_claim", {}))
        task = claimed["task"]
        assert task is not None, "a task was waiting for me"
        structured(await c.call_tool("task_update", {
            "id": task["id"], "status": "done", "note": f"done by {me['agent']}"}))
        structured(await c.call_tool("send_message", {
            "to": "parent", "subject": f"done task {task['id']}", "body": task["title"]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
