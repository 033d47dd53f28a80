"""A LangGraph graph whose checkpoints live in a Tether App's database (docs/langgraph.md).

    python examples/langgraph_example.py [--db sqlite:///path/to/app.db]

A three-node support-ticket graph runs with `TetherSaver(app)`: its node `draft` fails the
first time, as a crashed process would, and a second saver (a new process would open one the
same way) resumes the thread from its last checkpoint; `classify`, which had finished, does not
run again. The script then prints the thread's history and the rows the saver keeps in the
App's database (its own `tether_lg_*` tables, beside Tether's).
"""

from __future__ import annotations

import argparse
import operator
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import tether
from tether.integrations.langgraph import TetherSaver
from tether.store.drivers.sqlite import parse_sqlite_url


class Ticket(TypedDict, total=False):
    text: str
    category: str
    reply: str
    trail: Annotated[list[str], operator.add]


ran: list[str] = []
failures = {"draft"}  # `draft` fails once


def classify(ticket: Ticket) -> Ticket:
    ran.append("classify")
    category = "billing" if "invoice" in ticket["text"] else "general"
    return {"category": category, "trail": [f"classified as {category}"]}


def draft(ticket: Ticket) -> Ticket:
    ran.append("draft")
    if "draft" in failures:
        failures.discard("draft")
        raise RuntimeError("the process died while drafting")
    return {"reply": f"About your {ticket['category']} question: we are on it.",
            "trail": ["drafted"]}  # fmt: skip


def send(ticket: Ticket) -> Ticket:
    ran.append("send")
    return {"trail": [f"sent: {ticket['reply']}"]}


def build(saver: TetherSaver) -> Any:
    graph = StateGraph(Ticket)
    graph.add_node("classify", classify)
    graph.add_node("draft", draft)
    graph.add_node("send", send)
    graph.add_edge(START, "classify")
    graph.add_edge("classify", "draft")
    graph.add_edge("draft", "send")
    graph.add_edge("send", END)
    return graph.compile(checkpointer=saver)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", help="the App's database URL (default: a temporary SQLite file)")
    args = parser.parse_args()
    url = args.db or f"sqlite:///{Path(tempfile.mkdtemp(prefix='tether-lg-'))}/app.db"
    app = tether.App(url)  # the App whose database the graph shares
    thread = {"configurable": {"thread_id": "ticket-42"}}
    ticket: Ticket = {"text": "My invoice is wrong"}

    with TetherSaver(app) as saver:
        try:
            build(saver).invoke(ticket, thread, durability="sync")
        except RuntimeError as exc:
            print(f"first attempt: {exc}; nodes that ran: {ran}")

    with TetherSaver(app) as saver:  # as a restarted process would
        graph = build(saver)
        result = graph.invoke(None, thread, durability="sync")  # None: resume the thread
        print(f"resumed; nodes that ran overall: {ran}")
        print(f"reply: {result['reply']}")
        print("history, newest first:")
        for snapshot in graph.get_state_history(thread):
            step = snapshot.metadata["step"] if snapshot.metadata else "?"
            print(f"  step {step:>2}  next={snapshot.next}  trail={snapshot.values.get('trail')}")

    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(parse_sqlite_url(url)[0])) as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tether_lg_%' "
                "ORDER BY name")]  # fmt: skip
            for table in tables:
                (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                print(f"{table:<24} {count:>3} rows   in {parse_sqlite_url(url)[0]}")


if __name__ == "__main__":
    main()
