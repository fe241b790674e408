# Everything runs from a project-local virtualenv, created on first use.
# Only Python >= 3.11 and access to PyPI are needed on a fresh machine.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: .venv venv demo test docs proto bench clean

.venv venv: $(STAMP)

# Re-installs only when pyproject.toml changes (the package itself is editable).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/pip install -e '.[dev,spark]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/p2p_demo.py
	$(BIN)/python examples/sac_demo.py
	$(BIN)/python examples/pipeline/run.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy pykka_delivery
	$(BIN)/lint-imports --no-cache
	$(BIN)/mkdocs build --strict --site-dir build/site
	$(BIN)/python -m pytest

# The documentation site (guides and API reference) into build/site; strict, so a broken
# link or cross-reference fails. Open build/site/index.html, or `mkdocs serve` to browse.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir build/site

# Regenerates pykka_delivery/protocol/*_pb2.py, *_pb2.pyi (and *_pb2_grpc.py for
# protos with a service) from the .proto files. Commit the result.
proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

bench: $(STAMP)
	$(BIN)/python bench/p2p_local.py
	$(BIN)/python bench/p2p_grpc.py
	$(BIN)/python bench/coordinator.py
	$(BIN)/python bench/durable.py
	$(BIN)/python bench/partitions.py
	$(BIN)/python bench/spark.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
