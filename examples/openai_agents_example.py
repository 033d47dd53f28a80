"""An OpenAI Agents SDK agent whose refund tool needs a person's approval, run durably by Tether.

    OPENAI_API_KEY=... python examples/openai_agents_example.py
    tether approvals list -d sqlite:///agents-example.db      (then approve it, see below)

The run waits (holding nothing) until someone decides; restart this script at any time and the
run goes on from the stored RunState.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

import tether
from tether.integrations.openai_agents import run_agent

app = tether.App(os.environ.get("TETHER_DATABASE_URL", "sqlite:///agents-example.db"))


def make_agent() -> object:
    from agents import Agent, function_tool

    @function_tool(needs_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} on order {order}"

    return Agent(name="support", instructions="Refund order A-7 for 25 euros.", tools=[refund])


@app.workflow()
async def ticket(question: str) -> object:
    return await run_agent(make_agent(), question, reviewers=["group:finance"],  # type: ignore[arg-type]
                           expires_in=timedelta(hours=4))  # fmt: skip


async def main() -> None:
    if not os.environ.get("OPENAI_API_KEY"):
        sys.exit("set OPENAI_API_KEY to run this example (the tests use a scripted model)")
    async with app:
        handle = await app.start(ticket, "Please refund my order A-7.", id="ticket-1")
        print("waiting for approval: tether approvals list -d", app.url)
        print(await handle.result())


if __name__ == "__main__":
    asyncio.run(main())
