"""A user's file, as mypy --strict must accept it with the installed tether (tests/test_typing.py):
decorated steps and workflows keep their types, and app.start checks a workflow's arguments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import tether

app = tether.App("sqlite:///typing.db")


@dataclass
class Report:
    title: str
    words: int


@app.step()
async def fetch(url: str, *, retries: int = 1) -> str:
    return url * retries


@app.step
def count(text: str) -> int:
    return len(text.split())


@app.workflow(timeout=timedelta(minutes=5))
async def research(topic: str, depth: int = 1) -> Report:
    text = await fetch(f"https://example.com/{topic}", retries=depth)
    words: int = await count(text)
    return Report(topic, words)


@app.workflow
async def plain(n: int) -> list[int]:
    return [n]


async def main() -> None:
    handle = await app.start(research, "llamas", depth=2)
    report: Report = await handle.result()
    print(report.title.upper(), report.words + 1)
    with_id = await app.start(research, "llamas", id="r-1")
    again: Report = await with_id.result(timeout=10)
    numbers: list[int] = await (await app.start(plain, 3)).result()
    by_name: tether.RunHandle[Any] = await app.start("research", "anything", 1, id="r-2")
    print(again, numbers, await by_name.result())
