"""LangGraph on Tether's database: `TetherSaver`, a checkpointer, and `run_graph`, which answers
a graph's `interrupt()` with Tether approvals (docs/langgraph.md).

    from tether.integrations.langgraph import TetherSaver, run_graph

    graph = builder.compile(checkpointer=TetherSaver(app))
    values = await run_graph(graph, {...}, thread_id="t-1", reviewers=["sre"])  # in a workflow

`saver` is the BaseCheckpointSaver, `ops` its operations written once for every backend and
caller (run by the store's query runner, tether.store.query), `sqlite` and `postgres` the
connections, `sql/` the tables and queries; `interrupts` the approval bridge.
"""

from tether.integrations.langgraph.interrupts import run_graph
from tether.integrations.langgraph.saver import TetherSaver

__all__ = ["TetherSaver", "run_graph"]
