# The README's two commands: `make demo` (set up, then the main job) and `make test`.
.PHONY: setup demo test

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	.venv/bin/python -m pytest
