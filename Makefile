# Every target creates and uses the project's own virtualenv at .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/cep check examples/*.cep
	$(BIN)/cep run examples/finance.cep --events examples/data/trades.jsonl

bench: $(STAMP)
	$(BIN)/python bench/bench_reference.py
	$(BIN)/python bench/bench_core.py
	$(BIN)/python bench/bench_fpga.py
	$(BIN)/python bench/bench_gpu.py

lint: $(STAMP)
	$(BIN)/ruff check cep_core services accel tests

clean:
	rm -rf $(VENV) build *.egg-info
