# The team's vocabulary: install, test, check, demo, bench (browser: the inbox tests' Chromium;
# lock: uv.lock again after the dependencies in pyproject.toml changed).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install lock test check demo crash-demo bench browser clean

install: $(STAMP)

# The project's uv, read from its one pin (the dev extra of pyproject.toml): pip installs that uv
# into .venv, which then keeps it, since `uv sync` installs exactly what uv.lock lists.
UV_VERSION = $(shell sed -n 's/^ *"uv==\([^"]*\)".*/\1/p' pyproject.toml)
# uv's settings, for its own calls only: the project's .venv and its Python (never one
# downloaded), TLS trusted as the system trusts it (as pip and curl do).
UV = UV_PROJECT_ENVIRONMENT=$(VENV) UV_PYTHON=$(BIN)/python UV_PYTHON_DOWNLOADS=never \
	UV_SYSTEM_CERTS=1 $(BIN)/uv

# .venv (made by $(PY)) and, in it, the project's uv.
define venv-with-uv
test -x $(BIN)/python || $(PY) -m venv $(VENV)
test "$$($(BIN)/uv --version 2>/dev/null)" = "uv $(UV_VERSION)" || \
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
endef

# Installs what uv.lock lists (the project editable, every extra), nothing resolved anew; again
# only when the lock or the project's metadata changed: a no-op `make install` takes well under
# 2 s. After editing the dependencies in pyproject.toml: `make lock`, and commit uv.lock.
# Bytecode compiled once here, as pip does (5 to 10 s): each process then imports the heavy extras
# about 3 s sooner where PYTHONDONTWRITEBYTECODE is set and .pyc files are never written.
$(STAMP): pyproject.toml uv.lock
	$(venv-with-uv)
	$(UV) sync --frozen --all-extras --compile-bytecode
	touch $(STAMP)

# The suite on two processes (pytest-xdist, a test file per process at a time), then the tests
# marked `serial` alone: those bound an elapsed time (a recovery under 2 s...), need the CPU at a
# moment, or set state for the whole process (pyproject.toml's markers; `pytest -q` runs it all).
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -m serial

check: install
	@$(UV) lock --check --quiet || { echo "uv.lock does not match pyproject.toml:" \
		"run \`make lock\` (.venv/bin/uv lock) and commit uv.lock" >&2; exit 1; }
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests/test_layout.py

# After editing the dependencies in pyproject.toml: resolves them again into uv.lock (the
# versions already locked are kept where they still fit; `make lock UPGRADE=1` takes the newest).
lock:
	$(venv-with-uv)
	$(UV) lock $(if $(UPGRADE),--upgrade)

# The inbox's browser tests drive Debian's Chromium (headless); installed once per machine.
browser:
	command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

demo: install
	$(BIN)/python examples/agent_demo.py

crash-demo: install
	$(BIN)/python examples/crash_demo.py

bench: install
	$(BIN)/python bench/engine.py
	$(BIN)/python -m bench.postgres
	$(BIN)/python bench/waits.py
	$(BIN)/python bench/approvals.py
	$(BIN)/python bench/streams.py
	$(BIN)/python bench/langgraph.py
	$(BIN)/python -m bench.transactions
	$(BIN)/python -m bench.retention
	$(BIN)/python -m bench.console
	$(BIN)/python -m bench.pages
	$(BIN)/python -m bench.peers  # peers from a scratch venv (bench/peers.py says how); skipped without

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The long model-checked soak (tests/faults/test_soak.py): 600 runs start over 5 minutes on
# SQLite, 200 over 3 on PostgreSQL; TETHER_SOAK_SEED, _RUNS and _SECONDS override.
.PHONY: soak reliability-report
soak: install
	TETHER_SOAK_SECONDS=$${TETHER_SOAK_SECONDS:-300} TETHER_SOAK_RUNS=$${TETHER_SOAK_RUNS:-600} \
		$(BIN)/python -m pytest -q tests/faults/test_soak.py

# Runs the fault and crash suites, then rewrites the figures section of docs/reliability.md.
reliability-report: install
	$(BIN)/python bench/reliability_report.py
