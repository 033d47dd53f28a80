# The team's vocabulary: install, test, check, demo, bench (browser: the inbox tests' Chromium).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install test check demo crash-demo bench browser clean

install: $(STAMP)

# Reinstalls only when the project's metadata changed: a no-op `make install` takes well under 2 s.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[all,dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

check: install
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests/test_layout.py

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
