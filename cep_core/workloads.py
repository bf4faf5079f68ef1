"""Benchmark workloads: deterministic, seeded event generators and the queries they feed.

`WORKLOADS[name]` is a `Workload`: `generate(n_events, seed) -> pyarrow.Table` (a `seq`
column 0..n-1, then the stream's attributes in schema order; ints, and times in the
schema's unit, as int64), `query_text(**options)` (a query file for `cep run`) and the
`stream` it reads. Generation is vectorized numpy (no Python object per event), so ten
million events take seconds; the same (n_events, seed, params) always gives the same table.

    cep gen finance1 --events 1000000 --seed 7 --out /tmp/f1   # trades.parquet, finance1.cep
    cep run /tmp/f1/finance1.cep --events /tmp/f1/trades.parquet

| workload | stream | query |
| --- | --- | --- |
| finance0..5 | trades | Hirzel (DEBS 2012) Table 5 style MATCH patterns per symbol |
| twitter1, twitter2 | tweets | MATCH of '#cep' bursts per author; per-author WINDOW counts |
| marathon | checkpoints | Woods et al.: a runner skips a checkpoint |
| r5 | rules | Cugola & Margara's base scenario, EACH and LAST rules |
| q9 | ticks | CQPH template, 1..K concurrent queries (`queries=K`) |
| hyper | stocks | HYPERSONIC-style SEQ of length 3-7 with one NOT or one KLEENE |

Each generator takes keyword parameters with the published values as defaults (e.g.
`r5`'s `att_max=50000`); tests shrink them so that small streams already match.
"""

from __future__ import annotations

# Deferred imports: pyarrow.parquet loads only when a workload is written as Parquet.

import functools
import textwrap
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.event_io import EventFormat
from cep_core.schema import SchemaRegistry, StreamSchema

SECOND, MINUTE = 1_000, 60_000
# A generator's attribute columns: numpy arrays, or pyarrow arrays for strings.
Columns = dict[str, npt.NDArray[Any] | pa.Array]
T0_2012 = 1_330_612_200_000  # 2012-03-01T14:30:00Z (09:30 New York), in ms
FORMATS = (EventFormat.PARQUET, EventFormat.JSONL, EventFormat.CSV)

# ------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class Workload:
    """A named generator of one stream's events plus the query file that reads them.

    `make(rng, n, **params)` returns the attribute columns (numpy arrays, or pyarrow arrays
    for strings); `query(seed, **options)` the query file text. `params` are the
    generator's parameters with their defaults; `options` the query options accepted
    besides `seed` (every workload takes `seed`; only some queries depend on it)."""

    name: str
    stream: str
    doc: str
    make: Callable[..., Columns]
    query: Callable[..., str]
    params: dict[str, Any] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    # How users write these events (`written`): the generated table -> the table written
    # to files (times as text, fields the schema does not name); None: as generated.
    spell: Callable[[np.random.Generator, pa.Table], pa.Table] | None = None

    def schema(self) -> StreamSchema:
        schema = SchemaRegistry().get(self.stream)
        if schema is None:
            raise LookupError(f"no schema for stream {self.stream!r}")
        return schema

    def generate(self, n_events: int, seed: int = 0, **params: Any) -> pa.Table:
        """`n_events` events as a table: `seq`, then the schema's attributes in order."""
        if n_events < 0:
            raise ValueError("n_events must not be negative")
        unknown = set(params) - set(self.params)
        if unknown:
            raise ValueError(f"workload {self.name}: unknown parameter(s) "
                             f"{', '.join(sorted(unknown))} (known: "
                             f"{', '.join(self.params) or 'none'})")
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        columns = self.make(rng, n_events, **{**self.params, **params})
        return _table(self.schema(), n_events, columns)

    def written(self, n_events: int, seed: int = 0, **params: Any) -> pa.Table:
        """The events as a file holds them (what `cep gen` writes): `generate`'s table, or
        for a realistic workload that table as users write it (no `seq`; its `spell`)."""
        table = self.generate(n_events, seed, **params)
        if self.spell is None:
            return table
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode()), 1])
        return self.spell(rng, table.drop_columns(["seq"]))

    def query_text(self, seed: int = 0, **options: Any) -> str:
        """The query file; `seed` matters only to workloads whose query is drawn (hyper)."""
        unknown = set(options) - set(self.options)
        if unknown:
            raise ValueError(f"workload {self.name}: unknown query option(s) "
                             f"{', '.join(sorted(unknown))} (known: "
                             f"{', '.join(self.options) or 'none'})")
        return self.query(seed, **options)


WORKLOADS: dict[str, Workload] = {}


def _register(workload: Workload) -> None:
    WORKLOADS[workload.name] = workload


_ARROW_TYPES = {"int": pa.int64(), "timestamp": pa.int64(), "float": pa.float64(),
                "string": pa.string(), "bool": pa.bool_()}


def arrow_schema(schema: StreamSchema) -> pa.Schema:
    """The table layout of a stream's events: `seq`, then the attributes in schema order."""
    return pa.schema([("seq", pa.int64())] +
                     [(name, _ARROW_TYPES[kind]) for name, kind in schema.attributes.items()])


def _table(schema: StreamSchema, n: int, columns: Columns) -> pa.Table:
    layout = arrow_schema(schema)
    arrays = [pa.array(np.arange(n, dtype=np.int64))]
    for name in layout.names[1:]:
        column = columns[name]
        if len(column) != n:
            raise AssertionError(f"column {name} has {len(column)} values, not {n}")
        arrays.append(pa.array(column).cast(layout.field(name).type))
    return pa.Table.from_arrays(arrays, schema=layout)


# ------------------------------------------------------------------ shared helpers


def _strings(names: list[str], index: npt.NDArray[np.integer[Any]]) -> pa.Array:
    """names[index] as an Arrow string column (one take, no Python string per event)."""
    return pa.array(names, pa.string()).take(pa.array(index, pa.int32()))


def _zipf(rng: np.random.Generator, k: int, s: float, n: int) -> npt.NDArray[np.integer[Any]]:
    """n draws from 0..k-1 with P(i) proportional to 1 / (i + 1) ** s (probabilities
    rounded to multiples of 2**-20: a table lookup, several times faster than choice)."""
    return _zipf_table(k, s)[rng.integers(0, _ZIPF_TABLE, n)]


_ZIPF_TABLE = 1 << 20


@functools.lru_cache(maxsize=16)
def _zipf_table(k: int, s: float) -> npt.NDArray[np.int32]:
    p = 1.0 / np.arange(1, k + 1) ** s
    cdf = np.cumsum(p / p.sum())
    found = np.searchsorted(cdf, (np.arange(_ZIPF_TABLE) + 0.5) / _ZIPF_TABLE)
    table = np.minimum(found, k - 1).astype(np.int32)
    table.flags.writeable = False
    return table


def _arrival_times(rng: np.random.Generator, n: int, mean_gap: float,
                   t0: int) -> npt.NDArray[np.int64]:
    """Poisson arrivals: non-decreasing integer times, exponential gaps of `mean_gap`."""
    return t0 + np.floor(np.cumsum(rng.exponential(mean_gap, n))).astype(np.int64)


def _cumsum_by_group(group: npt.NDArray[np.integer[Any]],
                     steps: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Running sum of `steps` within each group (dense ids 0..k-1), in stream order,
    inclusive of the current step."""
    if len(group) == 0:
        return steps.copy()
    k = int(group.max()) + 1
    key = group.astype(np.int16) if k <= np.iinfo(np.int16).max else group
    order = np.argsort(key, kind="stable")  # a radix sort for 16-bit keys
    total = np.cumsum(steps[order])
    sizes = np.bincount(group, minlength=k)
    starts = np.cumsum(sizes) - sizes
    # the running total before each group's first step
    before = np.concatenate((np.zeros(1, total.dtype), total))[starts]
    out = np.empty_like(total)
    out[order] = total - np.repeat(before, sizes)
    return out


@functools.lru_cache(maxsize=8)
def _symbols(count: int) -> list[str]:
    """`count` distinct tickers: well-known NASDAQ names, then made-up ones (fixed, not
    seeded: every seed trades the same symbols; a shorter list is a prefix of a longer)."""
    known = ["AAPL", "AMZN", "AVID", "MSFT", "GOOG", "INTC", "CSCO", "ORCL", "QCOM", "YHOO",
             "EBAY", "NVDA", "AMGN", "GILD", "CMCSA", "COST", "SBUX", "ADBE", "AMAT", "TXN",
             "DELL", "NFLX", "PCLN", "BIDU", "MU", "SIRI", "ATVI", "EXPE", "INTU", "ISRG",
             "MRVL", "NTAP", "SYMC", "VOD", "WYNN", "XLNX", "YNDX", "FAST", "PAYX", "ROST"]
    names = list(known[:count])
    taken = set(names)
    rng = np.random.default_rng(390)
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    while len(names) < count:
        name = "".join(letters[rng.integers(0, 26, 4)])
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def _quoted(values: Iterable[object]) -> str:
    return ", ".join(f"'{v}'" for v in values)


# ------------------------------------------------------------------ finance (trades)

FINANCE_SYMBOLS = _symbols(390)


def _trades(rng: np.random.Generator, n: int, symbols: int = 390, zipf: float = 1.0,
            volatility: float = 0.0008, mean_gap_ms: float = 5.0) -> Columns:
    """NASDAQ-like trades: Zipf-skewed symbols, a geometric random walk per symbol in whole
    cents, log-normal volumes (about 9% above 900 shares), Poisson arrivals."""
    sym = _zipf(rng, symbols, zipf, n)
    base = np.exp(rng.uniform(np.log(1_000), np.log(50_000), symbols))  # $10 .. $500
    walk = _cumsum_by_group(sym, rng.normal(0.0, volatility, n))
    price = np.maximum(1, np.rint(base[sym] * np.exp(walk))).astype(np.int64)
    volume = np.maximum(1, np.rint(np.exp(rng.normal(5.2, 1.2, n)))).astype(np.int64)
    return {"symbol": _strings(_symbols(symbols), sym), "price": price,
            "volume": volume, "ts": _arrival_times(rng, n, mean_gap_ms, T0_2012),
            "seqNum": np.arange(n, dtype=np.int64)}


# The M-shape (Hirzel's double top) as Flink users write it in MATCH_RECOGNIZE: its PATTERN
# and DEFINE, the one text of bench/bench_recognize.py's, tests/recognize_flink's and
# tests/test_recognize_service.py's statements (bench/peers/flink_runner.py, run beside
# Flink, spells its own).
MSHAPE_RECOGNIZE_DEFINE = """PATTERN (S R1+ D1+ R2+? D2* E)
  DEFINE
    R1 AS R1.price > S.price AND R1.price >= COALESCE(LAST(R1.price, 1), S.price),
    D1 AS D1.price >= S.price AND D1.price < COALESCE(LAST(D1.price, 1), LAST(R1.price)),
    R2 AS R2.price > S.price AND R2.price >= COALESCE(LAST(R2.price, 1), LAST(D1.price)),
    D2 AS D2.price >= S.price AND D2.price < COALESCE(LAST(D2.price, 1), LAST(R2.price)),
    E AS E.price < S.price AND E.price < COALESCE(LAST(D2.price), LAST(R2.price))"""

_RISE_DROP_DEEP = """\
DEFINE rise AS price > First(price) AND price >= Last(price),
       drop AS price >= First(price) AND price < Last(price),
       deep AS price < First(price) AND price < Last(price)"""

_FINANCE = {
    # name: (one-line doc, PATTERN/DEFINE/EMIT body)
    "finance0": ("three trades of a symbol at strictly rising prices", """\
PATTERN ( . rise rise )
DEFINE rise AS price > Last(price)
EMIT symbol = symbol, seqNum = First(seqNum), gain = Last(price) - First(price)"""),
    "finance1": ("M-shape (double top): rise, drop, rise, then below the start", f"""\
PATTERN ( . rise+ drop+ rise+ drop* deep )
{_RISE_DROP_DEEP}
EMIT symbol = symbol, seqNum = First(seqNum), count = Count(), maxPrice = Max(price)"""),
    "finance2": ("V-shape: falls below the start, then turns up", """\
PATTERN ( . drop+ rise+ )
DEFINE drop AS price < Last(price),
       rise AS price > Last(price) AND price < First(price)
EMIT symbol = symbol, seqNum = First(seqNum), count = Count(), low = Min(price),
     depth = First(price) - Min(price)"""),
    "finance3": ("volume burst: consecutive trades of more than 900 shares (aggregate-free)",
                 """\
PATTERN ( big big+ )
DEFINE big AS volume > 900
EMIT symbol = symbol, seqNum = First(seqNum), trades = Count(), volume = Sum(volume)"""),
    "finance4": ("the price range within 50 trades exceeds 1% of the first price", """\
PATTERN ( . hold* move )
DEFINE hold AS Count() < 50,
       move AS Count() < 50 AND ((price - Min(price)) * 100 > First(price)
                                 OR (Max(price) - price) * 100 > First(price))
EMIT symbol = symbol, seqNum = First(seqNum), count = Count(), first = First(price),
     hi = Max(price), lo = Min(price)"""),
    "finance5": ("head and shoulders: three peaks above the start, then below it", f"""\
PATTERN ( . rise+ drop+ rise+ drop+ rise+ drop* deep )
{_RISE_DROP_DEEP}
EMIT symbol = symbol, seqNum = First(seqNum), count = Count(), maxPrice = Max(price)"""),
}


def _finance_query(name: str, doc: str, body: str) -> Callable[..., str]:
    def query(seed: int) -> str:
        return (f"-- {name} (Hirzel, DEBS 2012, Table 5 style): {doc}.\n"
                f"QUERY {name} FROM trades INTO {name}\nPARTITION BY symbol\n{body};\n")
    return query


for _name, (_doc, _body) in _FINANCE.items():
    _register(Workload(_name, "trades", _doc, _trades, _finance_query(_name, _doc, _body),
                       params={"symbols": 390, "zipf": 1.0, "volatility": 0.0008,
                               "mean_gap_ms": 5.0}))


# ------------------------------------------------------------------ twitter (tweets)

HASHTAGS = ["#cep", "#kafka", "#flink", "#streaming", "#spark", "#bigdata", "#ai", "#data",
            "#python", "#rust", "#cloud", "#ml", "#news", "#music", "#sports", "#nyc"]
HASHTAGS += [f"#topic{i:03d}" for i in range(300 - len(HASHTAGS))]


def _tweets(rng: np.random.Generator, n: int, authors: int = 2000, author_zipf: float = 1.1,
            tag_zipf: float = 1.2, mean_gap_ms: float = 20.0) -> Columns:
    """Tweets: Zipf-active authors; content is 1-3 hashtags (probabilities .5/.3/.2) drawn
    from a Zipf vocabulary whose most frequent tag is '#cep'."""
    author = _zipf(rng, authors, author_zipf, n)
    tags = [pa.array(_zipf(rng, len(HASHTAGS), tag_zipf, n), pa.int32()) for _ in range(3)]
    count = rng.choice(3, size=n, p=[0.5, 0.3, 0.2]) + 1
    vocab = pa.array(HASHTAGS, pa.string())
    parts = [vocab.take(tags[0])]
    for k in (1, 2):  # a null part (tag k absent) is skipped by the join
        parts.append(vocab.take(pc.if_else(pa.array(count > k), tags[k],
                                           pa.scalar(None, pa.int32()))))
    content = pc.binary_join_element_wise(*parts, " ", null_handling="skip")
    names = [f"user{i:05d}" for i in range(authors)]
    return {"author": _strings(names, author), "content": content,
            "ts": _arrival_times(rng, n, mean_gap_ms, T0_2012)}


_TWEET_PARAMS = {"authors": 2000, "author_zipf": 1.1, "tag_zipf": 1.2, "mean_gap_ms": 20.0}


def _twitter1_query(seed: int) -> str:
    return """\
-- twitter1: an author posts '#cep' alone in two or more consecutive tweets.
QUERY twitter1 FROM tweets INTO twitter1
PARTITION BY author
PATTERN ( tag tag+ )
DEFINE tag AS content = '#cep'
EMIT author = author, tweets = Count(), seconds = Delta(ts) / 1000;
"""


def _twitter2_query(seed: int) -> str:
    return """\
-- twitter2: per author, tweets about one streaming topic in the last minute, every 10 s.
QUERY twitter2 INTO twitter2
SELECT author, count(*) AS tweets
FROM tweets [RANGE 1 minute SLIDE 10 seconds]
WHERE content IN ('#cep', '#kafka', '#flink', '#streaming')
GROUP BY author;
"""


_register(Workload("twitter1", "tweets", "consecutive '#cep' tweets per author (MATCH)",
                   _tweets, _twitter1_query, params=dict(_TWEET_PARAMS)))
_register(Workload("twitter2", "tweets", "tweets per author, RANGE 1 minute SLIDE 10 s (WINDOW)",
                   _tweets, _twitter2_query, params=dict(_TWEET_PARAMS)))


# ------------------------------------------------------------------ marathon (checkpoints)

CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan"]
_CHECKPOINT_KM = np.array([2.0, 13.0, 22.0, 33.0, 40.0])


def _checkpoints(rng: np.random.Generator, n: int, cheat: float = 0.03,
                 pace_s_per_km: float = 360.0, waves: int = 3) -> Columns:
    """Runners in start waves 20 minutes apart pass the five checkpoints in order at a
    log-normal pace; a fraction `cheat` skips one of Brooklyn, Queens, Bronx. The stream is
    the first n passages in time (ties by bib number)."""
    runners = max(1, int(np.ceil(n / (5 - cheat) * 1.02)) + 5)
    start = (rng.integers(0, waves, runners) * 20 * MINUTE
             + rng.uniform(0, 10 * MINUTE, runners))
    pace = pace_s_per_km * SECOND * np.exp(rng.normal(0.0, 0.2, runners))
    segment = np.diff(np.r_[0.0, _CHECKPOINT_KM])
    legs = segment[None, :] * pace[:, None] * rng.uniform(0.9, 1.1, (runners, 5))
    times = T0_2012 + np.floor(start[:, None] + np.cumsum(legs, axis=1)).astype(np.int64)
    passed = np.ones((runners, 5), dtype=bool)
    cheaters = np.flatnonzero(rng.random(runners) < cheat)
    passed[cheaters, rng.integers(1, 4, len(cheaters))] = False
    bib = np.broadcast_to(np.arange(1, runners + 1)[:, None], (runners, 5))[passed]
    where = np.broadcast_to(np.arange(5)[None, :], (runners, 5))[passed]
    ts = times[passed]
    # by time, ties by bib then checkpoint: the flat position j already orders (bib, where)
    order = np.argsort((ts - T0_2012) * len(ts) + np.arange(len(ts)))[:n]
    if len(order) < n:
        raise AssertionError("marathon: too few runners for the requested events")
    return {"runner": bib[order].astype(np.int64), "checkpoint": _strings(CHECKPOINTS,
                                                                          where[order]),
            "ts": ts[order]}


# Deliberately like tests/test_checker_ok.py SEMANTICS_EXAMPLES['marathon']: the docs' example
# query, written out where each is read
def _marathon_query(seed: int) -> str:
    return """\
-- marathon (Woods et al., VLDB 2010): a runner passes a checkpoint without the one before.
QUERY marathon FROM checkpoints INTO cheaters
PARTITION BY runner
PATTERN ( A NOTB* C | A NOTC* D | A NOTD* E )
DEFINE A AS checkpoint = 'Staten Island', NOTB AS checkpoint != 'Brooklyn',
       C AS checkpoint = 'Queens', NOTC AS checkpoint != 'Queens',
       D AS checkpoint = 'Bronx',  NOTD AS checkpoint != 'Bronx',
       E AS checkpoint = 'Manhattan'
EMIT runner = runner, at = checkpoint, passed = Count(), minutes = Delta(ts) / 60000;
"""


_register(Workload("marathon", "checkpoints", "runners who skip a checkpoint (aggregate-free)",
                   _checkpoints, _marathon_query,
                   params={"cheat": 0.03, "pace_s_per_km": 360.0, "waves": 3}))


# ------------------------------------------------------------------ r5 (rules, TESLA)

RULE_TYPES = ["A", "B", "C", "D", "E"]  # A, B, C and two noise types


def _rules(rng: np.random.Generator, n: int, att_max: int = 50_000, types: int = 5) -> Columns:
    """Cugola & Margara's base scenario: one event per tick, types uniform over A, B, C and
    noise types, `att` uniform in [1, att_max]."""
    kind = rng.integers(0, types, n)
    return {"type": _strings(RULE_TYPES[:types], kind),
            "att": rng.integers(1, att_max + 1, n, dtype=np.int64),
            "ts": np.arange(1, n + 1, dtype=np.int64)}


class R5Variant(StrEnum):
    """Which of r5's queries `query_text(variant=...)` writes; the value is the option's."""

    EACH = "each"
    LAST = "last"
    BOTH = "both"


_R5_PICKS = {R5Variant.EACH: "EACH", R5Variant.LAST: "LAST"}


def _r5_query(seed: int, variant: str = R5Variant.BOTH) -> str:
    try:
        picked = R5Variant(variant)
    except ValueError:
        raise ValueError("r5: variant is each, last or both") from None
    chosen = list(_R5_PICKS) if picked is R5Variant.BOTH else [picked]
    text = ["-- r5 (Cugola & Margara's base scenario): A -> B -> C with equal att, "
            "100000 ticks per step.\n-- (a.att = c.att rather than a.att = b.att: a LAST "
            "step's conditions may only read later steps; the two say the same.)"]
    for v in chosen:
        p = _R5_PICKS[v]
        text.append(f"QUERY r5_{v.value} FROM rules INTO r5_{v.value}\n"
                    f"DETECT C c, {p} B b WITHIN 100000 FROM c, {p} A a WITHIN 100000 FROM b\n"
                    f"WHERE a.att = c.att AND b.att = c.att\n"
                    f"EMIT att = c.att;")
    return "\n\n".join(text) + "\n"


_register(Workload("r5", "rules", "3-step TESLA rule with parameters, EACH and LAST variants",
                   _rules, _r5_query, params={"att_max": 50_000, "types": len(RULE_TYPES)},
                   options=("variant",)))


# ------------------------------------------------------------------ q9 (ticks, CQPH)

TICK_SYMBOLS = FINANCE_SYMBOLS[:30]  # the q9 queries draw from these


def _ticks(rng: np.random.Generator, n: int, symbols: int = 100, zipf: float = 1.0,
           volatility: float = 0.0008, mean_gap_ms: float = 10.0) -> Columns:
    """Stock ticks: like trades (Zipf symbols, geometric walks), price in dollars."""
    sym = _zipf(rng, symbols, zipf, n)
    base = np.exp(rng.uniform(np.log(10.0), np.log(500.0), symbols))
    walk = _cumsum_by_group(sym, rng.normal(0.0, volatility, n))
    price = np.maximum(0.01, np.round(base[sym] * np.exp(walk), 2))
    volume = np.maximum(1, np.rint(np.exp(rng.normal(5.2, 1.2, n)))).astype(np.int64)
    return {"symbol": _strings(_symbols(symbols), sym), "price": price,
            "volume": volume, "time": _arrival_times(rng, n, mean_gap_ms, T0_2012)}


def _q9_query(seed: int, queries: int = 1) -> str:
    """`queries` instances of CQPH's Q9 template; instance 0 is fixed, the others draw
    their symbols and thresholds from a fixed generator (the same for every seed)."""
    if queries < 1:
        raise ValueError("q9: queries must be at least 1")
    text = [f"-- q9 (CQPH, IEICE 2015): {queries} concurrent instance"
            f"{'s' if queries != 1 else ''} of one template, differing in constants."]
    for i in range(queries):
        if i == 0:
            chosen, volume, price = ["AAPL", "GOOG", "MSFT"], 500, 50
        else:
            pick = np.random.default_rng([9, i])
            size = int(pick.integers(1, 9))
            drawn = pick.choice(len(TICK_SYMBOLS), size, replace=False)
            chosen = [TICK_SYMBOLS[j] for j in sorted(drawn)]
            volume = int(pick.integers(2, 21)) * 50
            price = int(pick.integers(1, 21)) * 5
        text.append(f"QUERY q9_{i:02d} INTO q9_{i:02d}\n"
                    f"SELECT max(price), time\n"
                    f"FROM ticks [RANGE 4 minutes SLIDE 1 minute WATTR time]\n"
                    f"WHERE symbol IN ({_quoted(chosen)}) AND (volume > {volume} OR "
                    f"price < {price})\n"
                    f"GROUP BY symbol;")
    return "\n\n".join(text) + "\n"


_register(Workload("q9", "ticks", "CQPH Q9 sliding max per symbol, 1 to K concurrent queries",
                   _ticks, _q9_query,
                   params={"symbols": 100, "zipf": 1.0, "volatility": 0.0008,
                           "mean_gap_ms": 10.0},
                   options=("queries",)))


# ------------------------------------------------------------------ hyper (stocks)

STOCK_TICKERS = FINANCE_SYMBOLS[:10]  # the hyper query draws from these


def _stocks(rng: np.random.Generator, n: int, tickers: int = 10, noise: float = 0.002) -> Columns:
    """Minute bars: every ticker once a minute, in a random order within the minute, all
    with the minute's time; prices are a shared market walk times independent noise."""
    minutes = -(-n // tickers)
    market = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.001, minutes)))
    order = np.argsort(rng.random((minutes, tickers)), axis=1).ravel()[:n]
    minute = np.arange(n) // tickers
    level = market[minute] * np.exp(rng.normal(0.0, noise, n))
    open_ = np.round(level, 2)
    close = np.round(level * np.exp(rng.normal(0.0, noise, n)), 2)
    peak = np.round(np.maximum(open_, close) * (1 + np.abs(rng.normal(0.0, noise, n))), 2)
    low = np.round(np.minimum(open_, close) * (1 - np.abs(rng.normal(0.0, noise, n))), 2)
    volume = np.maximum(1, np.rint(np.exp(rng.normal(7.0, 1.0, n)))).astype(np.int64)
    return {"ticker": _strings(_symbols(tickers), order),
            "ts": T0_2012 + minute.astype(np.int64) * MINUTE,
            "open": open_, "peak": peak, "low": low, "close": close, "volume": volume}


class HyperStep(StrEnum):
    """The hyper query's special step (its `kind` parameter)."""

    NOT = "not"
    KLEENE = "kleene"


def _hyper_query(seed: int, length: int | None = None, kind: str | None = None) -> str:
    """SEQ over `length` (3-7, drawn from the seed unless given) distinct tickers with
    rising opens, one of them NOT (cancelled by an open above the next step's) or
    KLEENE{1,3} (every element's open below the next step's), WITHIN length - 1 minutes
    (about one bar per ticker and step). The NOT / KLEENE sits at an inner position."""
    pick = np.random.default_rng([seed, 3_7])
    drawn_length = int(pick.integers(3, 8))
    drawn_kind = tuple(HyperStep)[int(pick.integers(0, 2))]
    length = drawn_length if length is None else length
    try:
        special_kind = drawn_kind if kind is None else HyperStep(kind)
    except ValueError:
        special_kind = None
    if not 3 <= length <= 7 or special_kind is None:
        raise ValueError("hyper: length is 3..7 and kind is not or kleene")
    tickers = [STOCK_TICKERS[j] for j in pick.choice(len(STOCK_TICKERS), length, replace=False)]
    special = int(pick.integers(1, length - 1))  # an inner position
    names = [chr(ord("a") + i) for i in range(length)]
    steps, where, emit = [], [], []
    positive = [i for i in range(length) if not (special_kind is HyperStep.NOT and i == special)]
    for i in range(length):
        t, v = tickers[i], names[i]
        if i != special:
            steps.append(f"{t} {v}")
        elif special_kind is HyperStep.NOT:
            steps.append(f"NOT({t} {v})")
            where.append(f"{v}.open > {names[positive[positive.index(i - 1) + 1]]}.open")
        else:
            steps.append(f"KLEENE({t} {v}){{1,3}}")
            where.append(f"{v}.open < {names[i + 1]}.open")
            emit.append(f"n = count({v})")
    singles = [i for i in positive
               if not (special_kind is HyperStep.KLEENE and i == special)]
    where[:0] = [f"{names[x]}.open < {names[y]}.open" for x, y in zip(singles, singles[1:])]
    text = (f"-- hyper (HYPERSONIC style, seed {seed}): SEQ of {length} with one "
            f"{special_kind.upper()}.\nQUERY hyper FROM stocks INTO hyper\n"
            f"PATTERN SEQ({', '.join(steps)})\n"
            f"{textwrap.fill('WHERE ' + ' AND '.join(where), 90, subsequent_indent='  ')}\n"
            f"WITHIN {length - 1} minutes")
    if emit:
        text += f"\nEMIT {', '.join(emit)}"
    return text + ";\n"


_register(Workload("hyper", "stocks", "SEQ of 3-7 tickers with one NOT or KLEENE (seeded)",
                   _stocks, _hyper_query, params={"tickers": 10, "noise": 0.002},
                   options=("length", "kind")))


# ------------------------------------------------------------------ realistic (users' data)

T0_2026 = 1_793_491_200_000  # 2026-11-01T00:00:00Z, in ms
# How users write times: (zone text, its offset in minutes, decimals, date-time separator),
# each for a run of 1000 events in turn.
ISO_SPELLINGS = [("Z", 0, 6, "T"), ("+02:00", 120, 3, "T"), ("", 0, 6, "T"),
                 ("-05:30", -330, 9, " "), ("+0100", 60, 3, "T")]


def iso_texts(ms: npt.NDArray[np.int64],
              spellings: Sequence[tuple[str, int, int, str]] = ISO_SPELLINGS,
              run: int = 1000) -> pa.Array:
    """Times in ms as ISO-8601 texts, the spelling changing every `run` events (a zone
    shifts the local time it shows; a spelling needs 3 decimals or more: no time is
    cut)."""
    which = (np.arange(len(ms)) // run) % len(spellings)
    out = pa.nulls(len(ms), pa.string())
    for k, (zone, minutes, decimals, separator) in enumerate(spellings):
        rows = np.flatnonzero(which == k)
        if not len(rows):
            continue
        local = ms[rows] + minutes * MINUTE
        text = pc.strftime(pa.array(local, pa.int64()).cast(pa.timestamp("ms")),
                           format=f"%Y-%m-%d{separator}%H:%M:%S")  # to the ms: .123
        text = pc.binary_join_element_wise(text, "0" * (decimals - 3), "")
        text = pc.binary_join_element_wise(text, zone, "")
        out = pc.replace_with_mask(out, _mask(len(ms), rows), text)
    return out


def _mask(n: int, rows: npt.NDArray[np.intp]) -> pa.Array:
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return pa.array(mask)


def _with_nulls(rng: np.random.Generator, column: pa.Array, share: float) -> pa.Array:
    """`column` with a `share` of its values null."""
    return pc.if_else(pa.array(rng.random(len(column)) < share),
                      pa.scalar(None, column.type), column)


def _plant(rng: np.random.Generator, n: int, devices: int = 50, zones: int = 7,
           mean_gap_ms: float = 2.0) -> Columns:
    """IoT readings: devices in zones, each temperature a random walk from its own base
    (15-30 C), humidity 20-60 %, mostly readings with a few alarms and service visits."""
    device = rng.integers(0, devices, n)
    base = rng.uniform(15.0, 30.0, devices)
    temp = np.round(base[device] + _cumsum_by_group(device, rng.normal(0.0, 0.3, n)), 2)
    kind = rng.choice(3, size=n, p=[0.97, 0.02, 0.01])
    return {"device": _strings([f"dev-{i:03d}" for i in range(devices)], device),
            "zone": _strings([f"zone-{i}" for i in range(zones)], device % zones),
            "kind": _strings(["reading", "alarm", "service"], kind), "temp": temp,
            "humidity": np.round(rng.uniform(20.0, 60.0, n), 1),
            "ts": _arrival_times(rng, n, mean_gap_ms, T0_2026)}


def _plant_spell(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """ISO-8601 times in five spellings; a firmware version, a nested `meta` object and a
    `note` (mostly null) the schema does not name."""
    n = table.num_rows
    device = pc.cast(pc.utf8_slice_codeunits(table.column("device"), 4), pa.int64())
    meta = pa.StructArray.from_arrays(
        [pa.array(-40 - rng.integers(0, 50, n)), pa.array(np.round(rng.uniform(0, 1, n), 3)),
         pa.StructArray.from_arrays([pa.array(rng.integers(0, 4, n))], ["channel"])],
        ["rssi", "battery", "radio"])
    note = _with_nulls(rng, _strings(["recalibrated", "door open", "low battery"],
                                     rng.integers(0, 3, n)), 0.95)
    return table.set_column(table.schema.get_field_index("ts"), "ts",
                            iso_texts(table.column("ts").to_numpy())) \
        .append_column("firmware", pc.binary_join_element_wise(
            "1.2.", pc.cast(pc.divide(device, 10), pa.string()), "")) \
        .append_column("meta", meta).append_column("note", note)


def _plant_query(seed: int) -> str:
    return """\
-- iot: a device warming up, an alarm right after a hot reading, zone averages.
QUERY iot_warming FROM plant INTO warming
PARTITION BY device
PATTERN ( warm hotter hotter+ )
DEFINE warm AS kind = 'reading' AND temp > 25,
       hotter AS kind = 'reading' AND temp > Last(temp)
EMIT device = device, readings = Count(), rise = Last(temp) - First(temp);

QUERY iot_alarm FROM plant INTO alarms
PATTERN SEQ(reading r, alarm a) WHERE r.device = a.device AND r.temp > 26 WITHIN 1 second;

QUERY iot_zones INTO zone_temps
SELECT zone, count(*) AS readings, avg(temp) AS temp, max(humidity) AS humidity
FROM plant [RANGE 1 minute SLIDE 10 seconds]
WHERE kind = 'reading'
GROUP BY zone;
"""


ACTIONS = ["login", "view", "cart", "purchase", "logout"]
ITEMS = [f"sku-{i:05d}" for i in range(1000)]


def _activity(rng: np.random.Generator, n: int, users: int = 500, items: int = 1000,
              mean_gap_ms: float = 20.0) -> Columns:
    """Shop activity: Zipf-active users; each action drawn from the one before it (a
    login, views, carts, purchases, a logout), items Zipf-popular, amounts for purchases
    (other types carry 0.0)."""
    user = _zipf(rng, users, 1.1, n)
    action = rng.choice(5, size=n, p=[0.05, 0.6, 0.17, 0.08, 0.1])
    item = _zipf(rng, items, 1.0, n)
    amount = np.where(action == 3, np.round(np.exp(rng.normal(3.5, 1.0, n)), 2), 0.0)
    return {"user": _strings([f"u{i:04d}" for i in range(users)], user),
            "type": _strings(ACTIONS, action), "item": _strings(ITEMS[:items], item),
            "amount": amount, "ts": _arrival_times(rng, n, mean_gap_ms, T0_2026)}


def _activity_spell(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """Times as `Z` texts with 3 decimals; per-type fields beside the schema's: `page` on
    views (else null), `coupon` on purchases (mostly null), `device` on logins (an
    object), and `referrer` null throughout."""
    n = table.num_rows
    kind = table.column("type").combine_chunks()
    times = iso_texts(table.column("ts").to_numpy(), [("Z", 0, 3, "T")])
    page = pc.if_else(pc.equal(kind, "view"), pc.binary_join_element_wise(
        "/p/", table.column("item"), ""), pa.scalar(None, pa.string()))
    coupon = pc.if_else(pc.and_(pc.equal(kind, "purchase"), pa.array(rng.random(n) < 0.2)),
                        pa.scalar("WELCOME10"), pa.scalar(None, pa.string()))
    device = pa.StructArray.from_arrays(
        [_strings(["ios", "android", "web"], rng.integers(0, 3, n)),
         pa.array(rng.integers(10, 18, n))], ["os", "version"],
        mask=pc.invert(pc.equal(kind, "login")))
    return table.set_column(table.schema.get_field_index("ts"), "ts", times) \
        .append_column("page", page).append_column("coupon", coupon) \
        .append_column("device", device) \
        .append_column("referrer", pa.nulls(n, pa.string()))


def _activity_query(seed: int) -> str:
    return """\
-- activity: browse then buy, a purchase soon after a login, sales per action.
QUERY shop_funnel FROM activity INTO funnel
PARTITION BY user
PATTERN ( seen seen* carted bought )
DEFINE seen AS type = 'view', carted AS type = 'cart', bought AS type = 'purchase'
EMIT user = user, views = Count() - 2, spent = Last(amount);

QUERY shop_quick_buy FROM activity INTO quick_buys
PATTERN SEQ(login l, purchase p) WHERE l.user = p.user WITHIN 5 seconds;

QUERY shop_sales INTO sales
SELECT type, count(*) AS actions, sum(amount) AS amount
FROM activity [RANGE 1 minute SLIDE 20 seconds]
GROUP BY type;
"""


PAGES = ["home", "search", "product", "cart", "checkout"]
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
          "Chrome/131.0.0.0 Safari/537.36",
          "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 "
          "(KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
          "Googlebot/2.1 (+http://www.google.com/bot.html)"]


def _clicks(rng: np.random.Generator, n: int, sessions: int = 2000,
            mean_gap_ms: float = 5.0) -> Columns:
    """Page views: Zipf-active sessions walking home, search, product, cart, checkout;
    long URLs (a path and a query string of 60-200 characters), referrers, 3% bots,
    latencies in ms."""
    session = _zipf(rng, sessions, 0.8, n)
    page = rng.choice(5, size=n, p=[0.15, 0.25, 0.4, 0.12, 0.08])
    product = rng.integers(0, 100_000, n)
    tail = _strings([f"utm_source=news&utm_medium=email&utm_campaign=c{i:03d}&q="
                     + "x" * (40 + 15 * (i % 10)) for i in range(100)],
                    rng.integers(0, 100, n))
    url = pc.binary_join_element_wise(
        "https://shop.example.com/", _strings(PAGES, page), "/",
        pc.cast(pa.array(product), pa.string()), "?", tail, "")
    referrer = _strings(["https://www.google.com/search?q=running+shoes",
                         "https://news.example.org/articles/2026/11/best-deals-of-the-week",
                         "", "https://shop.example.com/"], rng.integers(0, 4, n))
    return {"session": _strings([f"s-{i:06d}" for i in range(sessions)], session),
            "page": _strings(PAGES, page), "url": url, "referrer": referrer,
            "bot": rng.random(n) < 0.03,
            "latency": np.maximum(1, np.rint(np.exp(rng.normal(4.0, 0.6, n)))).astype(np.int64),
            "ts": _arrival_times(rng, n, mean_gap_ms, T0_2026)}


def _clicks_spell(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """Times as epoch ms (as web servers log them), a user agent, a nested `geo` object,
    an `experiment` flag and an `ab` bucket (null for most) the schema does not name."""
    n = table.num_rows
    geo = pa.StructArray.from_arrays(
        [_strings(["DE", "FR", "US", "JP", "BR"], rng.integers(0, 5, n)),
         pa.array(np.round(rng.uniform(-90, 90, n), 4)),
         pa.array(np.round(rng.uniform(-180, 180, n), 4))], ["country", "lat", "lon"])
    return table.append_column("agent", _strings(AGENTS, np.where(
        table.column("bot").to_numpy(zero_copy_only=False), 2, rng.integers(0, 2, n)))) \
        .append_column("geo", geo) \
        .append_column("experiment", pa.array(rng.random(n) < 0.5)) \
        .append_column("ab", _with_nulls(rng, _strings(["A", "B"], rng.integers(0, 2, n)),
                                         0.8))


def _clicks_query(seed: int) -> str:
    return """\
-- clicks: a session's way to checkout, a search that ends in the cart, pages per minute.
QUERY click_path FROM clicks INTO paths
PARTITION BY session
PATTERN ( seen seen* paid )
DEFINE seen AS page = 'product' AND NOT bot, paid AS page = 'checkout'
EMIT session = session, products = Count() - 1, slowest = Max(latency);

QUERY click_search_cart FROM clicks INTO search_to_cart
PATTERN SEQ(search s, cart c) WHERE s.session = c.session WITHIN 2 seconds;

QUERY click_load INTO page_load
SELECT page, count(*) AS views, avg(latency) AS latency, max(latency) AS slowest
FROM clicks [RANGE 1 minute SLIDE 10 seconds]
WHERE NOT bot
GROUP BY page;
"""


_register(Workload("iot", "plant", "IoT sensors with ISO-8601 times in five spellings, fields "
                   "and nested objects beside the schema (MATCH, SEQ, WINDOW)",
                   _plant, _plant_query, spell=_plant_spell,
                   params={"devices": 50, "zones": 7, "mean_gap_ms": 2.0}))
_register(Workload("activity", "activity", "shop actions as event types, per-type fields and "
                   "nulls beside the schema (MATCH, SEQ, WINDOW)",
                   _activity, _activity_query, spell=_activity_spell,
                   params={"users": 500, "items": 1000, "mean_gap_ms": 20.0}))
_register(Workload("clicks", "clicks", "clickstream with long URLs, booleans, unknown fields "
                   "and nested objects (MATCH, SEQ, WINDOW)",
                   _clicks, _clicks_query, spell=_clicks_spell,
                   params={"sessions": 2000, "mean_gap_ms": 5.0}))


# ------------------------------------------------------------------ writing events


def write_events(table: pa.Table, path: str | Path, fmt: str | None = None) -> Path:
    """Write a generated table as Parquet, JSON lines or CSV (by `fmt`, else by suffix).
    Nulls are JSON nulls (in CSV, empty fields); nested objects have no place in CSV and
    are left out there."""
    path = Path(path)
    name = fmt or path.suffix.lower().removeprefix(".")
    try:
        chosen = EventFormat(name)
    except ValueError:
        raise ValueError(f"unknown event format {fmt!r} (one of {', '.join(FORMATS)})") \
            from None
    if chosen is EventFormat.PARQUET:
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif chosen is EventFormat.JSONL:
        with open(path, "wb") as f:
            for batch in table.to_batches(max_chunksize=1 << 20):
                f.write(jsonl_lines(batch))
    else:
        import pyarrow.csv as pcsv

        flat = [name for name, column in zip(table.column_names, table.columns)
                if not pa.types.is_nested(column.type)]
        pcsv.write_csv(table.select(flat), path, pcsv.WriteOptions(quoting_style="needed"))
    return path


def jsonl_lines(batch: pa.RecordBatch) -> bytes:
    """One JSON object per row, built column-wise. Strings that would need escaping are
    never generated here; if one is, the batch falls back to orjson row by row."""
    texts = _json_texts(pa.StructArray.from_arrays(batch.columns, batch.schema.names))
    if texts is None:
        return b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
                        for row in batch.to_pylist())
    lines = pc.binary_join_element_wise(texts, "\n", "")
    if len(lines) == 0:
        return b""
    _validity, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    text: bytes = data.to_pybytes()[bounds[0]:bounds[-1]]
    return text


def _json_texts(column: pa.Array) -> pa.Array | None:
    """Each value of `column` as JSON text (objects for structs, `null` for nulls), or
    None where a string would need escaping."""
    if pa.types.is_struct(column.type):
        pieces: list[str | pa.Array] = []
        for i, child in enumerate(column.type):
            text = _json_texts(column.field(i))
            if text is None:
                return None
            pieces += [("{" if i == 0 else ",") + f'"{child.name}":', text]
        pieces.append("}")
        text = pc.binary_join_element_wise(
            *[p if isinstance(p, pa.Array) else pa.scalar(p, pa.string()) for p in pieces], "")
    elif pa.types.is_string(column.type):
        if pc.any(pc.match_substring_regex(column, r'[\x00-\x1f"\\]')).as_py():
            return None
        text = pc.binary_join_element_wise('"', column, '"', "")
    elif pa.types.is_floating(column.type):
        text = column.cast(pa.string())
        text = pc.if_else(pc.match_substring_regex(text, "[.eEn]"), text,
                          pc.binary_join_element_wise(text, ".0", ""))
    elif pa.types.is_boolean(column.type):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_null(column.type):
        return pa.array(["null"] * len(column), pa.string())
    else:
        text = column.cast(pa.string())
    return pc.if_else(pc.is_valid(column), text, "null") if column.null_count else text
