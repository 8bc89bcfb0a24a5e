# Quota Spawner: one-word entry points. Every target that runs the hub or
# containers goes through `setup` first; it is idempotent and skips what is
# already done (a no-op run takes a second or two).

.PHONY: setup images demo test test-fast lint bench labextension editor

setup:
	scripts/setup.sh

images:
	scripts/build-images.sh

demo: setup
	scripts/demo.sh

# The tests and the bench run on a private engine with the fake NVIDIA hook
# (scripts/test-dockerd.sh); tests/harness.py points DOCKER_HOST at it, and the ledger's
# tests also run on a private PostgreSQL (scripts/test-postgres.sh). Two runs: the
# unit and service layers on every core and one more (pytest-xdist), then the end-to-end
# and browser layers on E2E_WORKERS workers, the modules of each shared hub on one of them
# (--dist loadgroup, groups in tests/conftest.py). Each lists its 25 slowest tests; the
# last line sums up. Three workers on two cores: much of an end-to-end test is waiting (a
# grace period, a cull, a boot), and a third worker fills it (567 s with two, 434-476 s
# with three).
E2E_WORKERS ?= 3
# The unit and service layers on one worker more than the cores, for the same reason: some
# service tests wait on timers (112 s on two workers, 91-98 s on three, 2 cores).
FAST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test:
	SETUP_ENGINE=test scripts/setup.sh
	scripts/test-postgres.sh
	@t0=$$(date +%s); \
	.venv/bin/python -m pytest -v -n $(FAST_WORKERS) --durations=25 tests/unit tests/service; fast=$$?; \
	.venv/bin/python -m pytest -v -n $(E2E_WORKERS) --dist loadgroup --durations=25 tests/e2e tests/browser; \
	slow=$$?; \
	echo "make test: $$(( $$(date +%s) - t0 )) s in all; unit and service: exit $$fast," \
	     "e2e and browser: exit $$slow"; \
	[ $$fast -eq 0 ] && [ $$slow -eq 0 ]

# The unit and service layers only, on every core and one more: no engine, hub or browser
# (a minute); the private PostgreSQL (scripts/test-postgres.sh) for the ledger's tests on
# a server.
test-fast:
	scripts/test-postgres.sh
	.venv/bin/python -m pytest -n $(FAST_WORKERS) --durations=25 tests/unit tests/service

# ruff, then the architecture's import contracts (pyproject.toml [tool.importlinter];
# docs/architecture.md#the-layers)
lint:
	.venv/bin/ruff check spawner tests bench hub_config labextension scripts images/common
	.venv/bin/lint-imports

bench:
	SETUP_ENGINE=test scripts/setup.sh
	.venv/bin/python bench/spawn_bench.py
	.venv/bin/python bench/gpu_bench.py
	.venv/bin/python bench/monitor_bench.py
	.venv/bin/python bench/watchdog_bench.py
	.venv/bin/python bench/preempt_bench.py
	.venv/bin/python bench/preempt_handover_bench.py
	.venv/bin/python bench/usage_bench.py
	.venv/bin/python bench/storm_bench.py
	.venv/bin/python bench/admission_bench.py
	scripts/test-postgres.sh
	.venv/bin/python bench/state_bench.py

# The JupyterLab status-bar item: builds labextension/ into spawner/labextension/
# (committed, installed with the package) and stamps it with its sources
# (docs/jupyterlab-status-bar.md). Needs node >= 20.19 and npm. Builds against
# the JupyterLab in .venv (its staging/package.json), not a download.
labextension:
	cd labextension && npm ci --no-audit --no-fund
	cd labextension && rm -rf lib tsconfig.tsbuildinfo && npm run build:lib
	.venv/bin/jupyter-builder build labextension --core-package-file="$$(.venv/bin/python -c \
	  'import jupyterlab, pathlib; print(pathlib.Path(jupyterlab.__file__).parent / "staging" / "package.json")')"
	.venv/bin/python labextension/stamp.py

# The quota table editor's browser bundle: builds editor/ (CodeMirror 6 with the table's
# JSON Schema) into spawner/webapp/static/editor.js and its license file, both committed
# and installed with the package. Pinned versions (editor/package-lock.json); needs node
# >= 20 and npm.
editor:
	cd editor && npm ci --no-audit --no-fund
	cd editor && npm run build
