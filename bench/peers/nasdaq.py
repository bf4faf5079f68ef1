"""OpenCEP's NASDAQ minute-bar files, enlarged: copies one after another, each copy's
timestamps shifted by COPY_SHIFT, written both in OpenCEP's format (Metastock 7 lines) and
as JSON lines for schemas/stocks.json (ts in ms, UTC)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Far more than a file's span (one trading day) plus the largest window (1 day), so no match
# spans two copies: an enlarged file has exactly `copies` times the matches of the original.
COPY_SHIFT = timedelta(days=2)
STAMP = "%Y%m%d%H%M"


def read_bars(path: Path) -> list[list[str]]:
    return [line.strip().split(",") for line in path.read_text().splitlines() if line.strip()]


def enlarge(bars: list[list[str]], copies: int) -> list[list[str]]:
    out = []
    for k in range(copies):
        shift = COPY_SHIFT * k
        for row in bars:
            ts = datetime.strptime(row[1], STAMP) + shift
            out.append([row[0], ts.strftime(STAMP), *row[2:]])
    return out


def to_json_line(row: list[str]) -> str:
    ts = datetime.strptime(row[1], STAMP).replace(tzinfo=UTC)
    return json.dumps({"ticker": row[0], "ts": int(ts.timestamp()) * 1000,
                       "open": float(row[2]), "peak": float(row[3]), "low": float(row[4]),
                       "close": float(row[5]), "volume": int(row[6])}, separators=(",", ":"))


def write_enlarged(source: Path, copies: int, out_dir: Path) -> tuple[Path, Path, int]:
    """(OpenCEP text file, JSON lines file, events) for `copies` copies of `source`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = enlarge(read_bars(source), copies)
    stem = f"{source.stem}_x{copies}"
    text, jsonl = out_dir / f"{stem}.txt", out_dir / f"{stem}.jsonl"
    text.write_text("".join(",".join(r) + "\n" for r in rows))
    jsonl.write_text("".join(to_json_line(r) + "\n" for r in rows))
    return text, jsonl, len(rows)
