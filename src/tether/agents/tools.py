"""Tools an agent may call: a step with a name, a description, a JSON schema of its parameters
(from the signature), and whether a person must approve each call first.

A tool is a step: awaiting it inside a workflow is a checkpointed call, whether an agent or the
workflow's own code calls it. The approval itself is asked by the agent loop, never here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from tether.agents.models import ToolSpec
from tether.agents.schema import parameters_schema
from tether.core.retry import Retry
from tether.core.step import Step
from tether.errors import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")

NeedsApproval = bool | Callable[[dict[str, Any]], bool]


class Tool(Step[P, R], Generic[P, R]):
    """A step a model may call. `needs_approval` (True, or a function of the arguments that
    says whether this call does) makes the agent ask `reviewers` before it runs."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        description: str | None,
        needs_approval: NeedsApproval,
        reviewers: Sequence[str],
        approval_expires_in: timedelta,
        retry: Retry | None,
        timeout: timedelta | None,
    ) -> None:
        super().__init__(fn, name=name, retry=retry, timeout=timeout, at_most_once=False,
                         reconcile=None)  # fmt: skip
        if not (isinstance(needs_approval, bool) or callable(needs_approval)):
            raise ConfigurationError(
                f"tool {name!r}: needs_approval is a bool or a function of the arguments"
            )
        if needs_approval is not False and (isinstance(reviewers, str) or not reviewers):
            raise ConfigurationError(
                f"tool {name!r} needs approval: give reviewers=[...] (names, 'group:<name>', "
                f"or '*' for anyone who may decide)"
            )
        self.description = (description or inspect.getdoc(fn) or name).strip()
        self.parameters = parameters_schema(fn)
        self.needs_approval = needs_approval
        self.reviewers = list(reviewers)
        self.approval_expires_in = approval_expires_in

    def __repr__(self) -> str:
        return f"<tether tool {self.name!r}>"

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def asks_approval(self, arguments: dict[str, Any]) -> bool:
        if callable(self.needs_approval):
            return bool(self.needs_approval(arguments))
        return self.needs_approval


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: NeedsApproval = False,
    reviewers: Sequence[str] = ("*",),
    approval_expires_in: timedelta = timedelta(hours=1),
    retry: Retry | None = None,
    timeout: timedelta | None = None,
) -> Tool[..., Any]:
    tool_name = name or fn.__name__
    if not tool_name.replace("_", "").replace("-", "").isalnum() or len(tool_name) > 64:
        raise ConfigurationError(
            f"a tool name is 1-64 letters, digits, '_' or '-' (model APIs require it): "
            f"{tool_name!r}"
        )
    return Tool(fn, name=tool_name, description=description, needs_approval=needs_approval,
                reviewers=reviewers, approval_expires_in=approval_expires_in, retry=retry,
                timeout=timeout)  # fmt: skip
