# Quota Spawner: one-word entry points. Every target that runs the hub or
# containers goes through `setup` first; it is idempotent and skips what is
# already done (a no-op run takes a second or two).

.PHONY: setup images demo test lint bench

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
	.venv/bin/ruff check spawner tests bench hub_config

bench:
	SETUP_ENGINE=test scripts/setup.sh
	.venv/bin/python bench/spawn_bench.py
	.venv/bin/python bench/gpu_bench.py
	.venv/bin/python bench/monitor_bench.py
