"""A guard on the contract suite itself: every operation of the Store port (each method of the
protocols tether.store.port.Store is made of) is called, as `.<name>(...)`, by some test of
tests/contract/, so a
new operation cannot land without a contract test. No operation is excluded.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tether.store.port import Store

HERE = Path(__file__).parent


def parts() -> list[type]:
    """The protocols Store is made of (its bases but Protocol itself)."""
    return [base for base in Store.__bases__ if base.__module__.startswith("tether.store.port")]


def port_operations() -> list[str]:
    """The methods of Store's parts, read from their source: every def in their bodies."""
    found = []
    for part in parts():
        (cls,) = ast.parse(inspect.getsource(part)).body
        assert isinstance(cls, ast.ClassDef)
        found += [n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return found


def called_methods() -> set[str]:
    """Every name called as `<something>.<name>(...)` by the contract tests (calls in code,
    not words in comments or strings); this guard does not count itself."""
    called: set[str] = set()
    for path in sorted(HERE.glob("*.py")):
        if path.name == Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                called.add(node.func.attr)
    return called


def test_the_port_is_read_whole() -> None:
    operations = port_operations()
    # What the parse found is what the class has: its callables, nothing else.
    members = {n for part in parts() for n, v in vars(part).items() if callable(v) and n[0] != "_"}
    assert set(operations) == members
    assert len(operations) == len(set(operations))
    assert {"open", "close", "create_run", "storage_sizes"} <= set(operations)


def test_every_store_operation_has_a_contract_test() -> None:
    missing = [name for name in port_operations() if name not in called_methods()]
    assert not missing, (
        f"Store operations that no test in {HERE} calls: {', '.join(missing)}; "
        f"add a contract test for each (it runs once per backend through the `store` fixture)"
    )
