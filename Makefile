# Quota Spawner: one-word entry points. Every target that runs the hub or
# containers goes through `setup` first; it is idempotent and skips what is
# already done (a no-op run takes a second or two).

.PHONY: setup images demo test lint bench labextension editor

setup:
	scripts/setup.sh

images:
	scripts/build-images.sh

demo: setup
	scripts/demo.sh

# The tests and the bench run on a private engine with the fake NVIDIA hook
# (scripts/test-dockerd.sh); tests/harness.py points DOCKER_HOST at it.
test:
	SETUP_ENGINE=test scripts/setup.sh
	.venv/bin/python -m pytest -v tests

lint:
	.venv/bin/ruff check spawner tests bench hub_config labextension scripts images/common

bench:
	SETUP_ENGINE=test scripts/setup.sh
	.venv/bin/python bench/spawn_bench.py
	.venv/bin/python bench/gpu_bench.py
	.venv/bin/python bench/monitor_bench.py
	.venv/bin/python bench/watchdog_bench.py
	.venv/bin/python bench/preempt_bench.py
	.venv/bin/python bench/preempt_handover_bench.py
	.venv/bin/python bench/usage_bench.py

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
