"""The error tree of Tether, in one place; every error a user can see derives from TetherError.

This module holds only exception classes; it imports nothing else from Tether. The class docstring
is the default message, and every message says what was wrong and what to do next.

    TetherError
    ├── ConfigurationError          bad App/step/workflow arguments, unknown workflow, bad URL
    ├── NotInWorkflow               a workflow-only helper called outside a running workflow
    ├── IdempotencyConflict         an existing run id started again with other arguments
    ├── DuplicateRun                an unfinished run of the queue has the same dedup key
    ├── RunNotFound                 no run with that id
    ├── EventRefused                an event for a run that has finished
    ├── ApprovalNotFound            no approval with that id
    ├── ApprovalRefused             a decision that may not be taken (reason says why); audited
    ├── SerializationError          a value cannot be encoded or decoded as JSON
    │   ├── PayloadTooLarge         an encoded value is over the configured limit
    │   └── ArgumentsRefused        a run's stored arguments do not fit its workflow: dead at once
    ├── NonDeterminismError         replay asked for another sequence than the recorded history
    ├── StepTimeout                 a step attempt ran past its timeout
    ├── WorkflowTimeout             a run went past its workflow's timeout
    ├── StepOutcomeUnknown          an at-most-once step started but its outcome was never recorded
    ├── StepInterrupted             an at-most-once attempt was cut short, and found not done
    ├── StepFailed                  a recorded step error whose original type cannot be rebuilt
    ├── LeaseLost                   this worker no longer owns the run it tried to write
    ├── StoreUnavailable            the database cannot be reached or written
    ├── WaitTimeout                 a caller's local wait ran out; the run goes on
    ├── RunFailed                   raised by handle.result() for a failed run
    │   └── RunDead                 ... for a dead run: the engine could not execute it
    ├── RunCancelled                raised by handle.result() for a cancelled run
    └── ValueNotFound               a run has not set the value asked for (also a LookupError)
    PermanentError                  raise it (or a subclass) in a step to fail without retrying

Control-flow signals (suspension, forced replay) live in ``tether.core.context``; they derive from
BaseException so that user code's ``except Exception`` cannot swallow them.
"""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Tether failed; the message says why and what to do."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip())


class ConfigurationError(TetherError):
    """Tether was configured wrongly; check the arguments named in this message."""


class NotInWorkflow(TetherError):
    """This helper only works inside a running workflow (or step); call it from there."""


class IdempotencyConflict(TetherError):
    """A run with this id exists with other arguments; use a new id or the same arguments."""


class DuplicateRun(TetherError):
    """An unfinished run of this queue has the same dedup key; wait for it or use another key."""

    def __init__(self, message: str | None = None, *, run_id: str = "") -> None:
        self.run_id = run_id  # the unfinished run holding the key
        super().__init__(message)


class RunNotFound(TetherError):
    """No run has this id; check the id or list runs with `tether runs list`."""


class EventRefused(TetherError):
    """The run has finished, so the event was not stored; nothing would ever read it."""


class ApprovalNotFound(TetherError):
    """No approval has this id; list them with `tether approvals list`."""


class ApprovalRefused(TetherError):
    """The decision was refused and nothing was decided; `reason` says why (it is audited)."""

    def __init__(self, message: str | None = None, *, reason: str = "") -> None:
        self.reason = reason  # a short code: wrong_reviewer, stale_digest, expired, ...
        super().__init__(message)


class SerializationError(TetherError):
    """A value cannot be stored as JSON; return dataclasses, pydantic models or JSON types."""


class ArgumentsRefused(SerializationError):
    """Stored arguments that the workflow's signature or type hints refuse. No execution of the
    same code can take them, so the run is dead at once rather than tried again."""


class PayloadTooLarge(SerializationError):
    """A value is over the payload limit; store it elsewhere and pass a reference instead."""


class NonDeterminismError(TetherError):
    """The workflow code asked for other steps than its recorded history; let old runs finish
    on the old code, or fork them from before the change."""

    def __init__(
        self,
        message: str | None = None,
        *,
        recorded: list[str] | None = None,
        requested: list[str] | None = None,
        position: str | None = None,
        difference: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self.recorded = recorded or []
        self.requested = requested or []
        self.position = position  # where replay first differs from the history, if known
        self.difference = difference  # (recorded, requested) there; None: nothing on that side
        super().__init__(message)


class StepTimeout(TetherError):
    """A step attempt ran past its timeout; raise the timeout or make the step faster."""


class WorkflowTimeout(TetherError):
    """The run went past its workflow's timeout and was failed; raise the timeout if needed."""


class StepOutcomeUnknown(TetherError):
    """An at-most-once step started but its outcome was never recorded (the process died).
    Check whether its effect happened, then resume or fail the run; a reconcile= hook
    automates this."""


class StepInterrupted(TetherError):
    """An at-most-once step attempt was cut short (its worker stopped, died or lost its lease)
    and its reconcile hook found it not done: it counts as a failed attempt, and the step's
    Retry decides whether another one runs."""


class StepFailed(TetherError):
    """A step failed with an error whose type could not be rebuilt on replay."""

    def __init__(self, message: str | None = None, *, error_type: str = "") -> None:
        self.error_type = error_type
        super().__init__(message)


class LeaseLost(TetherError):
    """This worker lost its lease on the run (another worker adopted it); it stops executing it."""


class StoreUnavailable(TetherError):
    """The database cannot be reached or written; check the URL, the disk and permissions."""


class WaitTimeout(TetherError):
    """The local wait ran out before the run finished; the run itself goes on. Wait again later."""


class _RunEnded(TetherError):
    def __init__(self, run_id: str, error: dict[str, Any] | None, message: str) -> None:
        self.run_id = run_id
        self.error = error or {}
        super().__init__(message)


class RunFailed(_RunEnded):
    """The run failed; `.error` holds the recorded error (type, message, traceback)."""

    def __init__(self, run_id: str, error: dict[str, Any] | None = None) -> None:
        err = error or {}
        super().__init__(
            run_id,
            error,
            f"run {run_id!r} failed: {err.get('type', 'Error')}: {err.get('message', '')}"
            f" (see `tether runs show {run_id}`)",
        )


class RunDead(RunFailed):
    """The run is dead (dead-lettered): the engine could not execute it, outside the workflow's
    own code (a checkpoint this code cannot decode, no code for its workflow...). `.error`
    holds why; fix that, then resume it (`tether runs resume ID`)."""

    def __init__(self, run_id: str, error: dict[str, Any] | None = None) -> None:
        err = error or {}
        _RunEnded.__init__(
            self,
            run_id,
            error,
            f"run {run_id!r} is dead, the engine could not execute it: {err.get('type', 'Error')}:"
            f" {err.get('message', '')} (see `tether runs show {run_id}`)",
        )


class RunCancelled(_RunEnded):
    """The run was cancelled before it finished."""

    def __init__(self, run_id: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(run_id, error, f"run {run_id!r} was cancelled")


class ValueNotFound(TetherError, LookupError):
    """The run has not set this value; pass wait= to wait for it, or default= to get a
    fallback instead of this error."""


class PermanentError(Exception):
    """Raise this (or a subclass) from a step to fail it at once: it is never retried."""


__all__ = [
    "ConfigurationError",
    "DuplicateRun",
    "EventRefused",
    "IdempotencyConflict",
    "LeaseLost",
    "NonDeterminismError",
    "NotInWorkflow",
    "PayloadTooLarge",
    "PermanentError",
    "RunCancelled",
    "ValueNotFound",
    "RunDead",
    "RunFailed",
    "RunNotFound",
    "SerializationError",
    "StepFailed",
    "StepInterrupted",
    "StepOutcomeUnknown",
    "StepTimeout",
    "StoreUnavailable",
    "TetherError",
    "WaitTimeout",
    "WorkflowTimeout",
]
