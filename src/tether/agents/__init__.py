"""The durable agent loop: tools (steps a model may call, some only after a person approves),
model adapters, and Agent.run inside a workflow. Above approvals and streams; it never imports
a web framework or a backend.
"""

from tether.agents.loop import Agent, AgentResult, MaxTurnsExceeded
from tether.agents.tools import Tool

__all__ = ["Agent", "AgentResult", "MaxTurnsExceeded", "Tool"]
