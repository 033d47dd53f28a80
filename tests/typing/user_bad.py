"""A user's file with calls mypy --strict must refuse (tests/test_typing.py names each error by
its line)."""

from __future__ import annotations

import tether

app = tether.App("sqlite:///typing.db")


@app.step()
async def fetch(url: str) -> str:
    return url


@app.workflow()
async def research(topic: str, depth: int = 1) -> int:
    return len(await fetch(topic)) * depth


async def main() -> None:
    await app.start(research, 42)  # E: wrong-type
    await app.start(research, "llamas", depth="deep")  # E: wrong-keyword-type
    await app.start(research)  # E: missing
    await app.start(research, "llamas", colour="red")  # E: unknown-keyword
    handle = await app.start(research, "llamas")
    text: str = await handle.result()  # E: result-type
    await fetch(3)  # E: step-argument
    print(text)
