# Every target creates and uses the project's own virtualenv at .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full bench lint venv venv-flink clean sysdeps

# The project's own modules as bytecode: an editable install compiles none, and where
# PYTHONDONTWRITEBYTECODE is set Python writes none, so every `cep` process would compile
# ~65 modules from source (~0.07 s of CPU). Stale files are ignored, so this is re-run
# (it skips what is up to date) every time.
venv: $(STAMP)
	$(BIN)/python -m compileall -q cep_core services accel

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Simulators the FPGA tests run, the browser of the console's test and the Prometheus
# server that scrapes the services in a test, Graphviz for `cep explain --format svg`
# (Debian packages):
# installed only when missing. TOOL or TOOL:PACKAGE.
SYSDEPS := iverilog yosys chromium chromedriver:chromium-driver prometheus dot:graphviz
sysdeps:
	@missing=""; for dep in $(SYSDEPS); do tool=$${dep%%:*}; package=$${dep#*:}; \
	    command -v $$tool >/dev/null 2>&1 || missing="$$missing $$package"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
	    echo "missing:$$missing; install them as root: apt-get install$$missing" >&2; \
	    exit 1; \
	fi

# Test modules spread over TEST_JOBS processes (pytest-xdist; a module stays in one, so its
# kernels compile once). test-full draws many more random query shapes (each compiles).
TEST_JOBS ?= 2
test: sysdeps venv
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile

# Apache Flink (PyFlink) in a virtualenv of its own, for the MATCH_RECOGNIZE differential
# test against Flink itself (tests/recognize_flink/); its pins stay out of .venv.
FLINK_VENV := .venv-flink
venv-flink: $(FLINK_VENV)/.installed
$(FLINK_VENV)/.installed:
	test -x $(FLINK_VENV)/bin/python || $(PY) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/pip install -q apache-flink==2.3.0
	touch $@

test-full: sysdeps venv venv-flink
	CEP_TEST_FULL=1 $(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile

# The live demo: embedded broker, the chained pipeline (one process; add --distributed to
# DEMO_ARGS for splitter, 2 workers and coordinator as processes) and the web console
# (its URL is printed: http://127.0.0.1:8080/); ~20k trades at 2000/s (about 30 s),
# composite events shown as they arrive; then it all stays up for the console until
# Ctrl-C. CI runs a short verifying variant: make demo DEMO_ARGS="--count 5000 --verify".
DEMO_ARGS ?= --count 20000 --workers 2 --rate 2000 --hold
demo: venv
	$(BIN)/cep demo $(DEMO_ARGS)

bench: venv
	$(BIN)/python -m cep_service.bench.bench_reference
	$(BIN)/python -m cep_service.bench.bench_core --record
	$(BIN)/python -m cep_service.bench.bench_recognize --processes
	$(BIN)/python -m cep_service.bench.bench_backfill
	$(BIN)/python -m cep_service.bench.bench_fpga
	$(BIN)/python -m cep_service.bench.bench_gpu
	$(BIN)/cep bench e2e --json --record

# ruff on all the code, mypy on the product (its settings and the modules it skips for now:
# pyproject.toml). CI runs it before the tests.
# mypy knows modules by their folders' names, and the folders are not named as the packages
# install (setup.py maps them): it checks a tree of links that is.
TYPED ?= build/typed
lint: $(STAMP)
	$(BIN)/ruff check cep_core services accel bench tests
	rm -rf $(TYPED) && $(BIN)/python -m tests.layout $(TYPED)
	cd $(TYPED) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/$(TYPED).mypy_cache

clean:
	rm -rf $(VENV) build *.egg-info
