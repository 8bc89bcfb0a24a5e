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

test: setup
	.venv/bin/python -m pytest -v tests

lint:
	.venv/bin/ruff check spawner tests bench hub_config

bench: setup
	.venv/bin/python bench/spawn_bench.py
