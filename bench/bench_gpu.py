"""GPU benchmark (Cugola & Margara's R5 scenario): CPU AIP and CDP, and GPU CDP on a real
GPU only; then MATCH (batched per-key NFA): reference, CPU jit, and GPU on a real GPU only.
Usage: python bench/bench_gpu.py [EVENTS] [--quick] [--match] (--match: the MATCH columns
only). See bench/gpu_kernels.py and bench/gpu_match.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cep_service.bench import gpu_match as match_benchmark  # noqa: E402
from cep_service.bench.gpu_kernels import main  # noqa: E402

if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[1:] if a.isdigit()]
    quick = "--quick" in sys.argv
    if "--match" not in sys.argv:
        main(numbers[0] if numbers else 60_000, quick)
    match_benchmark.main(numbers[0] if numbers else 200_000, quick)
