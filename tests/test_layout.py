"""Guards on the shape of the code: the public API, the dependency direction of DESIGN §4,
module headers and sizes, and no hidden sources of time or randomness in the engine."""

from __future__ import annotations

import ast
import concurrent.futures
import gc
import subprocess
import sys
from pathlib import Path

import pytest

import tether

SRC = Path(tether.__file__).parent

# The public API, as promised: adding a name is a decision, removing one is a breaking change.
PUBLIC = {
    "ArgumentsRefused",
    "Named",
    "Retention",
    "Sender",
    "outbox",
    "OutboxMessage",
    "HttpSender",
    "set_value",
    "ValueInfo",
    "ValueNotFound",
    "ForkInfo",
    "Agent",
    "AgentResult",
    "MaxTurnsExceeded",
    "Tool",
    "models",
    "APPROVE_REJECT",
    "Approval",
    "ApprovalNotFound",
    "ApprovalRefused",
    "Decision",
    "HistoryEntry",
    "LogNotifier",
    "EmailNotifier",
    "SlackNotifier",
    "Notifier",
    "Option",
    "Reviewer",
    "Webhook",
    "approval",
    "operation_digest",
    "DuplicateRun",
    "Rate",
    "ChildHandle",
    "EventRefused",
    "Winner",
    "event",
    "patched",
    "sleep",
    "sleep_until",
    "start_child",
    "timer",
    "timer_until",
    "wait_any",
    "wait_for_event",
    "App",
    "Checkpoint",
    "CheckpointStatus",
    "ConfigurationError",
    "IdempotencyConflict",
    "LeaseLost",
    "NOT_DONE",
    "NO_RETRY",
    "NonDeterminismError",
    "NotInWorkflow",
    "PayloadTooLarge",
    "PermanentError",
    "Retry",
    "RunCancelled",
    "RunDead",
    "RunFailed",
    "RunHandle",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SerializationError",
    "Step",
    "StepFailed",
    "StepInterrupted",
    "StepOutcomeUnknown",
    "StepTimeout",
    "StoreUnavailable",
    "StreamReset",
    "stream",
    "SyncApp",
    "SyncRunHandle",
    "TetherError",
    "WaitTimeout",
    "Workflow",
    "WorkflowTimeout",
    "idempotency_key",
    "now",
    "random",
    "uuid4",
}

# Layers from the bottom up; a module may import its own layer and the layers below it.
LAYERS: list[tuple[str, ...]] = [
    (
        "tether.errors",
        "tether.clock",
        "tether.faults",
        "tether.serde",
        "tether.redact",
        "tether.webhooks",
        "tether.text",
    ),
    (
        "tether.store.query",
        "tether.store.tables",
        "tether.store.drivers.guard",
        "tether.store.drivers.ready",
    ),
    ("tether.store.port",),
    (
        "tether.store.keys",
        "tether.store.audit",
        "tether.store.rows",
        "tether.store.rules",
        "tether.store.ops",
    ),
    (
        "tether.store.drivers",
        "tether.store.sql_store",
        "tether.store.memory",
        "tether.store.sqlite",
        "tether.store.postgres",
        "tether.store",
    ),
    ("tether.core",),
    (
        "tether.approvals",
        "tether.streams",
        "tether.telemetry",
        "tether.outbox",
        "tether.schedules",
        "tether.values",
        "tether.forks",
        "tether.retention",
    ),
    ("tether.agents", "tether.models"),
    (
        "tether.app",
        "tether.sync",
        "tether.testing",
        "tether.views",
        "tether.users",
        "tether.actions",
    ),
    ("tether.integrations",),  # bridges to other frameworks: may use the App, never the reverse
    ("tether.server",),
    ("tether.cli", "tether.__main__", "tether"),
]


def layer_of(module: str) -> int:
    best = (-1, -1)
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best[1]:
                best = (index, len(name))
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in this test")
    return best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def tether_imports(path: Path) -> list[str]:
    """Modules of tether imported by this file, at any depth (lazy imports count too)."""
    found = []
    for node in ast.walk(_parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "tether"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tether":  # `from tether import faults` imports tether.faults
                found += [f"tether.{a.name}" for a in node.names]
            elif node.module.split(".")[0] == "tether":
                found += [node.module]
    return found


MODULES = sorted(SRC.rglob("*.py"))


def test_the_public_api_is_exactly_the_promised_names() -> None:
    assert set(tether.__all__) == PUBLIC
    assert len(tether.__all__) == len(set(tether.__all__))
    for name in tether.__all__:
        assert getattr(tether, name, None) is not None, name


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_imports_point_down_the_layers(path: Path) -> None:
    me = module_name(path)
    mine = layer_of(me)
    for imported in tether_imports(path):
        if imported == "tether" and me != "tether":
            raise AssertionError(f"{me} imports the package root; import the defining module")
        theirs = layer_of(imported)
        assert theirs <= mine, f"{me} (layer {mine}) imports {imported} (layer {theirs})"


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if module_name(p).startswith("tether.core")],
    ids=module_name,
)
def test_core_imports_no_backend_and_no_web_framework(path: Path) -> None:
    banned = (
        "tether.store.sqlite",
        "tether.store.drivers",
        "tether.store.memory",
        "tether.store.postgres",
        "sqlite3",
        "psycopg",
        "starlette",
        "fastapi",
        "uvicorn",
    )
    source = path.read_text()
    tree = _parse(source)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert not name.startswith(banned), f"{module_name(path)} imports {name}"
    # Time and randomness only through the injected clock and the recorded helpers.
    for pattern in ("datetime.now", "time.time", "random.", "uuid.uuid4", "time.monotonic"):
        assert pattern not in source, f"{module_name(path)} uses {pattern}"


def _parse(source: str) -> ast.Module:
    """ast.parse in a thread of its own, with the garbage collector off: CPython 3.11 keeps
    the AST constructor's recursion count in one place per interpreter (python/cpython#106905),
    so a parse started by a finalizer during this one (a collection that runs some object's
    __del__, which imports: pytest rewrites and parses the module) or a thread that unwound
    deep recursion before throws it off, and the parse fails with a spurious SystemError ("AST
    constructor recursion depth mismatch")."""

    def parse() -> ast.Module:
        gc.disable()
        try:
            return ast.parse(source)
        finally:
            gc.enable()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(parse).result()


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_every_module_opens_with_its_role_and_stays_small(path: Path) -> None:
    source = path.read_text()
    if not source.strip():
        return  # an empty package marker
    doc = ast.get_docstring(_parse(source))
    assert doc, f"{module_name(path)} has no docstring saying its role"
    assert len(source.splitlines()) <= 650, f"{module_name(path)} wants splitting"


def test_importing_tether_stays_light() -> None:
    code = (
        "import sys, tether, tether.models; "
        "heavy = [m for m in ('pydantic', 'sqlite3', 'rich', 'click', 'psycopg', 'starlette',"
        " 'jsonschema', 'fastapi', 'openai', 'anthropic', 'langgraph')"
        " if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
