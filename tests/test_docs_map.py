"""The maps of the code stay true to it: the layout of docs/architecture.md names every module
of tether, in its layer, and nothing that is gone; its Store port section names every operation
of every protocol `tether.store.port.Store` is made of, under that protocol; and the docstring
of tether/__init__.py names every top-level package and module in its paragraph on layering."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_layout import layer_of

import tether
from tether.store.port import Store

SRC = Path(tether.__file__).parent
DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
WHERE = "docs/architecture.md"


def module_path(path: Path) -> str:
    """A module as the layout names it: its path under src/tether without .py, a package by
    its folder (`store/port`), the root package `tether`."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "/".join(parts) or "tether"


MODULES = sorted(module_path(p) for p in SRC.rglob("*.py"))


def dotted(name: str) -> str:
    return "tether" if name == "tether" else "tether." + name.replace("/", ".")


def layout_block() -> str:
    """The layout: the page's first code block."""
    found = re.search(r"^```[^\n]*\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert found, f"{WHERE} has no layout (a code block naming every module, one per line)"
    return found.group(1)


def layout() -> list[tuple[str, str]]:
    """(name, role) of every line of the layout: one module (or, ending with /, a folder) per
    line, its role after it."""
    lines = [line.split(None, 1) for line in layout_block().splitlines() if line.strip()]
    return [(words[0], words[1] if len(words) > 1 else "") for words in lines]


def test_the_layout_names_every_module_with_its_role() -> None:
    named = {name for name, _ in layout()}
    missing = [m for m in MODULES if m not in named]
    assert not missing, (
        f"modules the layout of {WHERE} does not name: {', '.join(missing)}; add a line for "
        f"each to the layout (the page's first code block), in its layer, with its role"
    )
    mute = [name for name, role in layout() if not role.strip()]
    assert not mute, f"lines of the layout of {WHERE} without a role: {', '.join(mute)}"


def test_the_layout_names_nothing_that_is_gone() -> None:
    gone = [
        name
        for name, _ in layout()
        if not ((SRC / name).is_dir() if name.endswith("/") else name in MODULES)
    ]
    assert not gone, (
        f"the layout of {WHERE} names what src/tether does not hold: {', '.join(gone)}; "
        f"remove those lines or name the module by its path (`store/ops/runs`, a package by its "
        f"folder, a folder ending with /)"
    )


def paragraphs() -> list[list[str]]:
    """The modules the layout names, paragraph by paragraph (blank lines part them)."""
    blocks = [block.split("\n") for block in re.split(r"\n\s*\n", layout_block())]
    names = [[line.split()[0] for line in block if line.strip()] for block in blocks]
    return [[name for name in block if name in MODULES] for block in names if block]


def test_the_layout_has_one_paragraph_per_layer_from_the_top_down() -> None:
    """From the top (cli) down to errors, in the layers of tests/test_layout.py."""
    below = None
    for block in paragraphs():
        layers = {name: layer_of(dotted(name)) for name in block}
        assert len(set(layers.values())) <= 1, (
            f"a paragraph of the layout of {WHERE} mixes layers of tests/test_layout.py: "
            f"{', '.join(f'{n} ({i})' for n, i in layers.items())}; give each layer a paragraph"
        )
        if not layers:
            continue
        layer = next(iter(layers.values()))
        assert below is None or layer < below[1], (
            f"the layout of {WHERE} names {', '.join(layers)} (layer {layer} of "
            f"tests/test_layout.py) after {below[0]} (layer {below[1]}): list the layers from "
            f"the top down, one paragraph each"
        )
        below = (block[0], layer)


def store_port_section() -> str:
    found = re.search(r"^## The Store port\n(.*?)(?=^## |\Z)", DOC.read_text(), re.S | re.M)
    assert found, f"{WHERE} has no '## The Store port' section"
    return found.group(1)


def protocols() -> list[type]:
    """The protocols Store is made of (its bases from tether.store.port, not Protocol)."""
    return [b for b in Store.__bases__ if b.__module__.startswith("tether.store.port")]


def operations(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]


def table_names(text: str) -> list[str]:
    """The names in backticks in the first column of the table rows of `text`."""
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("|")]
    return [name for cell in rows for name in re.findall(r"`([^`]+)`", cell)]


def test_every_port_operation_is_in_the_table_of_its_protocol() -> None:
    section = store_port_section()
    for protocol in protocols():
        name, module = protocol.__name__, protocol.__module__.replace(".", "/")[len("tether/") :]
        found = re.search(rf"^### [^\n]*`{name}`[^\n]*\n(.*?)(?=^#|\Z)", section, re.S | re.M)
        assert found, (
            f"the Store port section of {WHERE} has no '### ... `{name}` ...' heading: add one "
            f"with a table of the operations of {name} ({module}), each with what it guarantees"
        )
        listed = table_names(found.group(1))
        missing = [op for op in operations(protocol) if op not in listed]
        assert not missing, (
            f"operations of {name} ({module}) that the table under its heading in {WHERE} does "
            f"not name: {', '.join(missing)}; add a row for each (`name` | what it guarantees)"
        )
        stale = [op for op in listed if op not in operations(protocol)]
        assert not stale, (
            f"the table of {name} in {WHERE} names what {name} has no operation for: "
            f"{', '.join(stale)}; remove those rows, or move them to their protocol's table"
        )


def layering() -> str:
    """The paragraph of tether/__init__.py's docstring that starts with "Layering"."""
    parts = (tether.__doc__ or "").split("\n\n")
    found = [" ".join(p.split()) for p in parts if p.startswith("Layering")]
    assert found, (
        "the docstring of src/tether/__init__.py has no paragraph starting with 'Layering' "
        "(the packages and modules of tether, from the top layer down)"
    )
    return found[0]


def test_the_package_docstring_names_every_top_level_package_and_module() -> None:
    top = sorted(
        p.stem if p.is_file() else p.name
        for p in SRC.iterdir()
        if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
        or (p.is_dir() and (p / "__init__.py").exists())
    )
    text = layering()
    missing = [name for name in top if not re.search(rf"(?<![\w./]){name}(?![\w/])", text)]
    assert not missing, (
        f"the 'Layering' paragraph of the docstring of src/tether/__init__.py does not name: "
        f"{', '.join(missing)}; add each in its layer"
    )
