"""Where a checkpoint sits in its run's history, whatever the order asyncio runs tasks in.

The workflow's own task is the root; each task that workflow code creates (`create_task`,
`gather`, `TaskGroup`, `asyncio.wait`'s tasks, `ensure_future`) is placed under the task that
created it, by the order of creation there, by a task factory installed on the loop. A
checkpoint's position is that task path, then its sequence within the task: both depend only
on the code and the recorded results, never on scheduling. Tasks created by Tether's own I/O
and inside steps are not placed. This module knows nothing of the store.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

from tether.errors import ConfigurationError

if TYPE_CHECKING:
    from tether.core.execution import RunContext

# The workflow task the code runs in (None outside workflow tasks, and in tasks Tether did not
# place).
_FRAME: contextvars.ContextVar[Frame | None] = contextvars.ContextVar("tether_frame", default=None)


class Frame:
    """One workflow task of one execution: its path, and what it has asked for so far."""

    __slots__ = ("children", "counts", "ctx", "label", "next", "path", "prefix", "quiet", "task")

    def __init__(self, ctx: RunContext, path: tuple[int, ...], task: asyncio.Task[Any] | None):
        self.ctx = ctx
        self.path = path
        self.task = task
        self.next = 0  # the sequence of its next checkpoint
        self.children = 0  # tasks it created so far
        self.counts: dict[str, int] = {}  # checkpoints asked for, by base name
        # > 0 while Tether's own I/O runs in this task: the tasks it creates are not workflow
        # tasks (a database driver's), so they take no place.
        self.quiet = 0
        self.prefix = "".join(f"{i}/" for i in path)
        self.label = "" if not path else "@" + ".".join(map(str, path))

    def position(self, local: int) -> str:
        return f"{self.prefix}{local}"

    def name(self, base: str, *, peek: bool = False) -> str:
        """The readable name of its next checkpoint called `base`: `base`, `base#2`, ... in
        the root task; `base@1`, `base@1#2`, `base@1.0` in the tasks it created."""
        count = self.counts.get(base, 0) + 1
        if not peek:
            self.counts[base] = count
        return f"{base}{self.label}" if count == 1 else f"{base}{self.label}#{count}"

    def spawn(self) -> Frame:
        index = self.children
        self.children += 1
        return Frame(self.ctx, (*self.path, index), None)


def here(ctx: RunContext) -> Frame:
    """The frame of the workflow task running now; ConfigurationError for code in a task that
    Tether did not place (created where it cannot see, e.g. with the loop's task factory
    replaced after the run started)."""
    frame = _FRAME.get()
    if frame is None or frame.ctx is not ctx or frame.task is not asyncio.current_task():
        raise ConfigurationError(
            f"workflow code of run {ctx.run_id!r} asked for a checkpoint from a task that "
            f"Tether did not see it create; create tasks with asyncio.create_task, gather, "
            f"TaskGroup or ensure_future from workflow code, and do not replace the event "
            f"loop's task factory while runs execute"
        )
    return frame


def internal(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """A task for Tether's own bookkeeping next to workflow code (a wait's timer): never a
    workflow task, so it takes no place among them."""
    return asyncio.Task(coro, loop=asyncio.get_running_loop())


class _Factory(Protocol):
    def __call__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]: ...


_Task = asyncio.Task


class Placer:
    """The loop's task factory while runs execute on it: places the tasks workflow code
    creates, and hands every task to the factory that was there before (or makes a plain
    Task)."""

    def __init__(self, previous: _Factory | None) -> None:
        self.previous = previous

    def __call__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        parent = _FRAME.get()
        if parent is None:  # not from workflow code (most tasks): as fast as can be
            if self.previous is None:
                return _Task(coro, loop=loop, **kwargs)
            return self.previous(loop, coro, **kwargs)
        child = parent.spawn() if not parent.quiet and parent.ctx.places(parent) else None
        context = kwargs.get("context")
        if context is None:
            context = kwargs["context"] = contextvars.copy_context()
        context.run(_FRAME.set, child)
        if self.previous is not None:
            task = self.previous(loop, coro, **kwargs)
        else:
            task = _Task(coro, loop=loop, **kwargs)
        if child is not None:
            assert isinstance(task, asyncio.Task)
            child.task = task
            child.ctx.adopt(task)
        return task


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Put the placer in front of the loop's task factory, once."""
    factory = loop.get_task_factory()
    if not isinstance(factory, Placer):
        loop.set_task_factory(Placer(factory))  # type: ignore[arg-type]


def runnable(task: asyncio.Task[Any]) -> bool:
    """Whether the task will run without anything else happening first: not done and not
    blocked on a pending future (a ready task, or one whose future just finished)."""
    if task.done():
        return False
    waiter: asyncio.Future[Any] | None = getattr(task, "_fut_waiter", None)
    return waiter is None or waiter.done()
