"""A remote A2A agent written with the official Python SDK (a2a-sdk), for tests/python/test_a2a.py:
guildhall calls it as the tool `a2a__sample__send`.

`python a2a_sample_agent.py PORT`. What it does with a message's text:
- `sleep N`: works N seconds, then completes (a call to kill it in the middle of);
- `ask`: asks a question (INPUT_REQUIRED); the answer that continues the task completes it
  with `answered: <answer>`;
- anything else: completes at once with the artifact `echo: <text>`.
"""

import asyncio
import sys

import uvicorn
from starlette.applications import Starlette

from a2a.helpers.proto_helpers import new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)


class Sample(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue) -> None:
        text = context.get_user_input().strip()
        task = context.current_task
        if task is None:
            task = Task(id=context.task_id, context_id=context.context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        asked = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if asked:
            await updater.add_artifact([new_text_part(f"answered: {text}")], name="answer")
            await updater.complete()
        elif text.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
            await updater.add_artifact([new_text_part("slept")], name="answer")
            await updater.complete()
        elif text == "ask":
            await updater.requires_input(
                updater.new_agent_message([new_text_part("What colour?")]))
        else:
            await updater.add_artifact([new_text_part(f"echo: {text}")], name="answer")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def main():
    port = int(sys.argv[1])
    card = AgentCard(
        name="sample",
        description="Echoes what it is told; asks when told `ask`.",
        version="1.0",
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0",
                                             url=f"http://127.0.0.1:{port}/")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Says back what it hears.",
                           tags=["test"])],
    )
    handler = DefaultRequestHandler(agent_executor=Sample(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, rpc_url="/")])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
