"""Models for `tether.Agent`: `tether.models.Scripted(turns)` for tests and offline demos,
`OpenAIChat` (OpenAI-compatible chat completions) and `AnthropicMessages` (optional extras
using the official SDKs), and the shapes they share. A namespace only: no code of its own.

The two adapters are imported at first use (PEP 562 `__getattr__`), so `import tether` never
imports an SDK, and an SDK that is not installed only matters to whoever uses its adapter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tether.agents.models import (
    Model,
    ModelError,
    ModelRequest,
    ModelResponse,
    RateLimited,
    Scripted,
    ToolCall,
    ToolSpec,
)
from tether.agents.providers import ModelRefused

if TYPE_CHECKING:
    from tether.agents.anthropic_messages import AnthropicMessages
    from tether.agents.openai_chat import OpenAIChat

_ADAPTERS = {
    "OpenAIChat": "tether.agents.openai_chat",
    "AnthropicMessages": "tether.agents.anthropic_messages",
}


def __getattr__(name: str) -> object:
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether.models' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


__all__ = [
    "AnthropicMessages",
    "Model",
    "ModelError",
    "ModelRefused",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChat",
    "RateLimited",
    "Scripted",
    "ToolCall",
    "ToolSpec",
]
