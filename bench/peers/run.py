"""`cep bench peers`: this product against real peers, side by side in one run.

    python bench/peers/run.py --opencep DIR [--scale 20 --scale 100] [--pattern NAME ...]
    python bench/peers/run.py --pyflink /tmp/flinkvenv/bin/python [--rows 1000000 ...]
    python bench/peers/run.py --opencep DIR --pyflink PY --json

OpenCEP (github.com/ilya-kolchinsky/OpenCEP, a checkout: --opencep or OPENCEP_DIR) runs
with --opencep-python (default: this interpreter; OpenCEP needs numpy only). Flink runs in
the interpreter of a separate virtualenv with apache-flink (--pyflink or PYFLINK_PYTHON).
See docs/peers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flink  # noqa: E402
import opencep  # noqa: E402
from report import flink_table, opencep_table  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="cep bench peers", description=__doc__.split("\n")[0])
    ap.add_argument("--opencep", metavar="DIR", type=Path,
                    default=os.environ.get("OPENCEP_DIR") or None,
                    help="An OpenCEP checkout (default: $OPENCEP_DIR).")
    ap.add_argument("--opencep-python", metavar="PYTHON", default=sys.executable,
                    help="The interpreter that runs OpenCEP (default: this one).")
    ap.add_argument("--scale", type=int, action="append", metavar="N",
                    help="Copies of each NASDAQ file (repeatable; default 20 and 100).")
    ap.add_argument("--pattern", action="append", metavar="NAME",
                    help="Only these OpenCEP patterns (repeatable; default all).")
    ap.add_argument("--pyflink", metavar="PYTHON", default=os.environ.get("PYFLINK_PYTHON"),
                    help="The interpreter of a virtualenv with apache-flink "
                    "(default: $PYFLINK_PYTHON).")
    ap.add_argument("--rows", type=int, action="append", metavar="N",
                    help="Trades for the Flink queries (repeatable; default 1M and 5M).")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the generated trades.")
    ap.add_argument("--workdir", metavar="DIR", type=Path,
                    help="Where inputs and outputs go (default: a temporary directory).")
    ap.add_argument("--json", action="store_true", help="One JSON object on stdout.")
    args = ap.parse_args(argv)
    if args.opencep is None and args.pyflink is None:
        ap.error("name a peer: --opencep DIR (OpenCEP; get it with "
                 f"`{opencep.CLONE}`) and/or --pyflink PYTHON (Flink; make it with "
                 f"`{flink.INSTALL}`)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="cep-peers-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = {}
        if args.opencep is not None:
            (work / "opencep").mkdir(exist_ok=True)
            result["opencep"] = opencep.run(args.opencep, args.scale or [20, 100],
                                            work / "opencep", args.pattern,
                                            args.opencep_python, progress)
        if args.pyflink is not None:
            (work / "flink").mkdir(exist_ok=True)
            result["flink"] = flink.run(args.pyflink, args.rows or [1_000_000, 5_000_000],
                                        work / "flink", args.seed, progress)
    if args.json:
        print(json.dumps(result))
        return
    if "opencep" in result:
        print(opencep_table(result["opencep"]))
    if "flink" in result:
        print(flink_table(result["flink"]))


if __name__ == "__main__":
    main()
