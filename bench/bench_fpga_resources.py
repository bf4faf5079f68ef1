"""The resource experiment (the paper's Figures 4 and 9) with Yosys: table, JSON and PNG.

    .venv/bin/python bench/bench_fpga_resources.py [--max-i 10] [--depths 100,...,800]
        [--png docs/fpga_resources.png] [--json FILE]

Synthesis is slow for deep partitioners (about 0.3 CPU seconds per element), so this is a
benchmark-style run, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cep_accel.fpga import resources  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-i", type=int, default=10)
    parser.add_argument("--depths", default="100,200,300,400,500,600,700,800")
    parser.add_argument("--png", default="fpga_resources.png")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    resources.require_yosys()

    def progress(row):
        print(f"  {row.circuit} {row.size}: {row.resources.luts} LUTs, "
              f"{row.resources.flip_flops} FFs ({row.resources.seconds:.1f} s)",
              file=sys.stderr, flush=True)

    rows = resources.automaton_rows(range(1, args.max_i + 1), progress)
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    rows += resources.partitioner_rows(depths, progress)
    print(resources.format_table(rows))
    print(f"plot: {resources.plot(rows, args.png)}")
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
