"""A walk-through of the Python API over a Parquet file of trades, as notebook cells
(`# %%`: VS Code, Jupytext, Spyder run them one by one; `python examples/trades_notebook.py
[FILE.parquet]` runs them all). Without a file, one is made with the finance1 generator
(what `cep gen finance1 --count 200000 --out DIR` writes), with Parquet timestamps and no
`seq` column, as a user's export would be. See docs/python.md."""

# %% A Parquet file of trades
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import cep_core as cep
from cep_core.workloads import WORKLOADS

EXAMPLES = Path(__file__).resolve().parent
COUNT = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
if len(sys.argv) > 1 and sys.argv[1] != "-":
    path = Path(sys.argv[1])
else:
    path = Path(tempfile.mkdtemp()) / "trades.parquet"
    trades = WORKLOADS["finance1"].generate(COUNT, seed=7).drop(["seq"])
    trades = trades.set_column(trades.column_names.index("ts"), "ts",
                               trades.column("ts").cast(pa.timestamp("ms")))
    pq.write_table(trades, path)
print(pq.read_schema(path))

# %% The queries: double tops per symbol and per-symbol activity windows
queries = cep.compile((EXAMPLES / "finance.cep").read_text())
print(queries)

# %% Run them (the jitted engines; engine="reference" for the interpreter)
result = queries.run(path)
print(f"{result.events:,} trades -> {len(result):,} composite events, "
      f"{len(result.dead_letters)} dead letters")
composites = result.table

# %% Double tops: which symbols, how long the patterns were
tops = composites.filter(pc.equal(composites.column("query"), "mshape")).to_pandas()
summary = tops.groupby("symbol").agg(double_tops=("seq", "size"), longest=("count", "max"),
                                     highest=("maxPrice", "max"))
print(summary.sort_values("double_tops", ascending=False).head(10))

# %% Windows: the busiest five minutes per symbol
windows = composites.filter(pc.equal(composites.column("query"), "activity")).to_pandas()
busiest = windows.sort_values("trades", ascending=False).groupby("symbol").head(1)
print(busiest[["symbol", "window_start", "window_end", "trades", "volume", "hi", "lo"]])

# %% The same, batch by batch, as a live feed would come
stream = queries.stream()
parts = [stream.push(batch) for batch in pq.ParquetFile(path).iter_batches(50_000)]
parts.append(stream.flush())
streamed = sum(part.num_rows for part in parts)
print(f"streamed in {len(parts) - 1} batches: {streamed:,} composite events")
assert streamed == len(result)
