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

# The live demo: embedded broker, splitter, 2 workers, coordinator; ~20k trades at 2000/s
# (bounded: about 15 s), composite events shown as they arrive, then everything stops.
demo: $(STAMP)
	$(BIN)/cep demo --events 20000 --workers 2 --rate 2000

bench: $(STAMP)
	$(BIN)/python bench/bench_reference.py
	$(BIN)/python bench/bench_core.py
	$(BIN)/python bench/bench_fpga.py
	$(BIN)/python bench/bench_gpu.py
	$(BIN)/cep bench e2e --json

lint: $(STAMP)
	$(BIN)/ruff check cep_core services accel tests

clean:
	rm -rf $(VENV) build *.egg-info
