#!/usr/bin/env bash
# One run of the GPU adapter on a real NVIDIA GPU (docs/gpu.md "Running on a GPU machine"):
# (a) tests/gpu at full size (CEP_GPU_DEVICE=1), (b) `cep gpu verify` on the examples the
# GPU runs, (c) bench/gpu_match.py and bench/gpu_kernels.py (GPU against the CPU jitted
# engines on the same input). Run from the repository root:
#
#   OUT=/some/dir bash bench/gpu_device_check.sh
#
# Wheels in .whl/ (dependencies the machine lacks) go to $CHECK_SITE (/tmp/site) first.
# Logs, JSON results and summary.txt go to $OUT (8 files). Each step has its own timeout
# and the whole run a deadline (CHECK_DEADLINE seconds), so a hang loses one step only.
#
# CHECK_SIMULATOR=1: a dry run of this script on a machine without a GPU: PYTHON (default
# .venv/bin/python), no wheel install, numba's CUDA simulator, small sizes.

set -u -o pipefail

SIM=${CHECK_SIMULATOR:-0}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
START=$(date +%s)
DEADLINE=${CHECK_DEADLINE:-560}
export SITE=${CHECK_SITE:-/tmp/site}
if [ "$SIM" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    export NUMBA_ENABLE_CUDASIM=1
    unset CEP_GPU_DEVICE
    SEQ_EVENTS=${SEQ_EVENTS:-5000}
    MATCH_EVENTS=${MATCH_EVENTS:-20000}
else
    PY=${PYTHON:-python3}
    export CEP_GPU_DEVICE=1
    unset NUMBA_ENABLE_CUDASIM
    SEQ_EVENTS=${SEQ_EVENTS:-100000}
    MATCH_EVENTS=${MATCH_EVENTS:-1000000}
fi
export PYTHONUNBUFFERED=1
SUMMARY=()

# The seconds a step may run: its own cap, less what the whole run has left.
allowed() {
    local left=$((DEADLINE - ($(date +%s) - START)))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# step NAME CAP LOG COMMAND...: runs COMMAND under a timeout, appending to $OUT/LOG.
step() {
    local name=$1 cap=$2 file=$3 log=$OUT/$3 t0 rc limit
    shift 3
    limit=$(allowed "$cap")
    t0=$(date +%s)
    if [ "$limit" -lt 5 ]; then
        echo "== $name: not run, the run's deadline (${DEADLINE}s) is spent" | tee -a "$log"
        SUMMARY+=("$(printf '%-34s %s' "$name" "NOT RUN (deadline)")")
        return
    fi
    echo "== $name (timeout ${limit}s): $*" | tee -a "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    local took=$(($(date +%s) - t0)) verdict=ok
    [ "$rc" -ne 0 ] && verdict="FAILED rc=$rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && verdict="TIMED OUT after ${took}s"
    echo "== $name: $verdict (${took}s)" | tee -a "$log"
    SUMMARY+=("$(printf '%-34s %-22s %4ss  %s' "$name" "$verdict" "$took" "$file")")
}

# --- environment -------------------------------------------------------------------------
{
    echo "date: $(date -u)  host: $(hostname)  simulator: $SIM  python: $PY"
    if [ "$SIM" != 1 ]; then
        if ls .whl/*.whl >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target "$SITE" .whl/*.whl && echo "installed: $(ls .whl)"
        else
            echo "no .whl/ folder: using the machine's packages only"
        fi
        # The project itself (its packages under their installed names, and the GPU
        # placement policy's entry point), built from this tree with the machine's setuptools.
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
            --no-cache-dir --target "$SITE" . && echo "installed: the project"
        # numba-cuda 0.30 registers an overload of np.row_stack, which numpy 2.5 removed: on
        # a machine with both, every CUDA kernel's compile fails on import. The shim gives
        # numpy the alias back (the machine's own packages, not ours).
        "$PY" -c 'import numpy, sys; sys.exit(hasattr(numpy, "row_stack"))' && {
            printf '%s\n' 'import numpy' \
                'if not hasattr(numpy, "row_stack"): numpy.row_stack = numpy.vstack' \
                >"$SITE/sitecustomize.py"
            echo "numpy $("$PY" -c 'import numpy; print(numpy.__version__)') has no row_stack: shimmed for numba-cuda"
        }
        export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi || echo "nvidia-smi: not found"
    "$PY" -m pip list 2>/dev/null | grep -iE '^(numba|numba-cuda|llvmlite|numpy|pyarrow|cuda-[a-z]+|cupy[a-z0-9-]*|lark|orjson|typer|pytest|hypothesis) '
    timeout 120 "$PY" - <<'EOF'
import platform, sys
import numba
from numba import cuda
print("python", platform.python_version(), "numba", numba.__version__, "numba.cuda from",
      cuda.__file__)
print("cuda.is_available():", cuda.is_available())
cuda.detect()
EOF
} 2>&1 | tee "$OUT/env.log"
[ "$SIM" != 1 ] && export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}

CLI=cep_service.cli.main

# --- (a) tests/gpu -----------------------------------------------------------------------
step "tests/gpu" 170 tests.log \
    "$PY" -m pytest -p no:cacheprovider -q -rfE --durations=15 tests/gpu

# --- (b) cep gpu verify: the GPU path against the reference interpreter -------------------
for pair in r4:abc: r4:abc:--memory-budget=1 marathon:checkpoints: fire:sensors: \
        fire:sensors:--memory-budget=1 finance:trades: stocks:stocks:; do
    IFS=: read -r query data extra <<<"$pair"
    step "verify $query $extra" 40 verify.log \
        "$PY" -m "$CLI" gpu verify "examples/$query.cep" --events "examples/data/$data.jsonl" \
        ${extra:+"$extra"}
done

# --- (c) benchmarks: the GPU engines against the CPU jitted engines on the same input -----
DRIVER=$(mktemp /tmp/gpu_bench_XXXX.py)
cat >"$DRIVER" <<'EOF'
import importlib, json, os, sys, time
sys.path.insert(0, os.getcwd())
which, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


gpu_kernels = importlib.import_module("cep_service.bench.gpu_kernels")
gpu_match = importlib.import_module("cep_service.bench.gpu_match")
device = importlib.import_module("cep_accel.gpu.device")
real = device.real_gpu()
print(f"real GPU: {real} ({device.name()})")
started = time.perf_counter()
if which == "match":
    rows = gpu_match.main(n, quick=False)
else:
    # quick=True takes the first two of each: the smallest and the largest window and
    # sequence length (where a GPU should gain most), 1 and 10 rules.
    gpu_kernels.WINDOWS, gpu_kernels.LENGTHS, gpu_kernels.RULES = \
        (10_000, 250_000), (3, 7), (1, 10)
    rows = gpu_kernels.main(n, quick=True)
took = time.perf_counter() - started
with open(out, "w") as f:
    json.dump({"bench": which, "events": n, "real_gpu": real, "device": device.name(),
               "seconds": took, "rows": rows}, f, indent=1, default=str)
print(f"{which}: {len(rows)} rows in {took:.1f} s -> {out}")
if not real:
    print("NOTE: no real GPU: the GPU column was not measured")
EOF
step "bench MATCH ($MATCH_EVENTS events)" 150 bench-match.log \
    "$PY" "$DRIVER" match "$MATCH_EVENTS" "$OUT/bench-match.json"
step "bench SEQ R5 ($SEQ_EVENTS events)" 200 bench-seq.log \
    "$PY" "$DRIVER" seq "$SEQ_EVENTS" "$OUT/bench-seq.json"

# --- summary -----------------------------------------------------------------------------
{
    echo
    echo "==== GPU device check: $(date -u), $(($(date +%s) - START))s, simulator=$SIM"
    grep -m1 "^python" "$OUT/env.log"
    grep -m1 "cuda.is_available" "$OUT/env.log"
    printf '%s\n' "${SUMMARY[@]}"
    echo "-- tests/gpu:"; grep -E "passed|failed|[Ee]rror" "$OUT/tests.log" | tail -3
    echo "-- verify:"; grep -cE "^agree" "$OUT/verify.log" | sed 's/$/ queries agree/'
    grep -E "DISAGREE|Error|error:" "$OUT/verify.log" | head -5
    for b in match seq; do
        echo "-- bench $b:"
        grep -vE "^(==|real GPU|\s*$)" "$OUT/bench-$b.log" 2>/dev/null | head -20
    done
} 2>&1 | tee "$OUT/summary.txt"
