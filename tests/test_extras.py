"""The CLI's map from an optional package to the extra that installs it (cli/common.EXTRAS) is
true to pyproject.toml: each extra it names exists and brings that package (itself or as a
dependency of what it lists), and every extra a user installs for a feature is in the map."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

from tether.cli.common import EXTRAS

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = {"all", "dev"}  # extras of extras, and the project's own tools


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings (`psycopg[binary]>=3.1` -> psycopg)."""
    found = (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r) for r in requirements)
    return {canonical(m.group(0)) for m in found if m}


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def test_each_package_the_cli_names_is_brought_by_the_extra_it_names() -> None:
    declared = extras()
    providers = packages_distributions()
    for module, extra in EXTRAS.items():
        assert extra in declared, f"{module}: no extra {extra!r} in pyproject.toml"
        direct = names(declared[extra])
        brought = set(direct)
        for dist in direct:  # one level down: starlette comes with fastapi
            brought |= names([r for r in requires(dist) or [] if "extra ==" not in r])
        provided_by = {canonical(d) for d in providers.get(module, [])}
        assert provided_by, f"{module} is not installed by any distribution here"
        assert provided_by & brought, (
            f"the CLI says `pip install 'tether[{extra}]'` for {module}, but that extra "
            f"brings {sorted(direct)}, none of which is or requires {sorted(provided_by)}"
        )


def test_every_feature_extra_is_named_by_the_cli() -> None:
    missing = set(extras()) - BUNDLES - set(EXTRAS.values())
    assert not missing, f"extras the CLI never names when their package is missing: {missing}"
