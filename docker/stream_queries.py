"""The example queries of each stream, for the image (Dockerfile) and its `queries` service.

    python stream_queries.py OUT_DIR [--schema DIR]... FILE...

checks every query file with `cep check --json` (the schemas built in, plus each
`--schema`) and writes `OUT_DIR/<stream>.cep` for every stream the files read: every
file whose queries all read that stream, one after another (a file reading several
streams goes nowhere). docker-compose.yml's `queries` service registers
`/app/queries/${CEP_STREAM}.cep` (docs/deploy.md). A file that does not check fails the
build. Prints one line per stream: the stream and its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def streams_of(files: list[str], schemas: list[str]) -> dict[str, list[str]]:
    """The files of each stream (files in the order given)."""
    command = [sys.executable, "-m", "cep_service.cli.main", "check", "--json"]
    for schema in schemas:
        command += ["--schema", schema]
    done = subprocess.run(command + files, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cep check refused the example queries:\n{done.stdout}"
                         f"{done.stderr}")
    found: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        checked = json.loads(line)
        streams = {q["stream"] for q in checked["queries"]}
        if len(streams) == 1:
            found.setdefault(streams.pop(), []).append(checked["file"])
    return found


def write(out: Path, found: dict[str, list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stream, files in sorted(found.items()):
        text = "".join(f"-- {name}\n{Path(name).read_text().rstrip()}\n\n" for name in files)
        (out / f"{stream}.cep").write_text(text)
        print(stream, " ".join(files))


def main(argv: list[str]) -> None:
    out, rest = Path(argv[0]), argv[1:]
    schemas, files = [], []
    while rest:
        if rest[0] == "--schema":
            schemas.append(rest[1])
            rest = rest[2:]
        else:
            files.append(rest.pop(0))
    write(out, streams_of(files, schemas))


if __name__ == "__main__":
    main(sys.argv[1:])
