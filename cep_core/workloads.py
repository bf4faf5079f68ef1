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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.schema import SchemaRegistry, StreamSchema

SECOND, MINUTE = 1_000, 60_000
T0_2012 = 1_330_612_200_000  # 2012-03-01T14:30:00Z (09:30 New York), in ms
FORMATS = ("parquet", "jsonl")

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
    make: Callable[..., dict]
    query: Callable[..., str]
    params: dict = field(default_factory=dict)
    options: tuple[str, ...] = ()

    def schema(self) -> StreamSchema:
        schema = SchemaRegistry().get(self.stream)
        if schema is None:
            raise LookupError(f"no schema for stream {self.stream!r}")
        return schema

    def generate(self, n_events: int, seed: int = 0, **params) -> pa.Table:
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

    def query_text(self, seed: int = 0, **options) -> str:
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


def _table(schema: StreamSchema, n: int, columns: dict) -> pa.Table:
    layout = arrow_schema(schema)
    arrays = [pa.array(np.arange(n, dtype=np.int64))]
    for name in layout.names[1:]:
        column = columns[name]
        if len(column) != n:
            raise AssertionError(f"column {name} has {len(column)} values, not {n}")
        arrays.append(pa.array(column).cast(layout.field(name).type))
    return pa.Table.from_arrays(arrays, schema=layout)


# ------------------------------------------------------------------ shared helpers


def _strings(names: list[str], index: np.ndarray) -> pa.Array:
    """names[index] as an Arrow string column (one take, no Python string per event)."""
    return pa.array(names, pa.string()).take(pa.array(index, pa.int32()))


def _zipf(rng: np.random.Generator, k: int, s: float, n: int) -> np.ndarray:
    """n draws from 0..k-1 with P(i) proportional to 1 / (i + 1) ** s (probabilities
    rounded to multiples of 2**-20: a table lookup, several times faster than choice)."""
    return _zipf_table(k, s)[rng.integers(0, _ZIPF_TABLE, n)]


_ZIPF_TABLE = 1 << 20


@functools.lru_cache(maxsize=16)
def _zipf_table(k: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, k + 1) ** s
    cdf = np.cumsum(p / p.sum())
    table = np.searchsorted(cdf, (np.arange(_ZIPF_TABLE) + 0.5) / _ZIPF_TABLE)
    table = np.minimum(table, k - 1).astype(np.int32)
    table.flags.writeable = False
    return table


def _arrival_times(rng: np.random.Generator, n: int, mean_gap: float, t0: int) -> np.ndarray:
    """Poisson arrivals: non-decreasing integer times, exponential gaps of `mean_gap`."""
    return t0 + np.floor(np.cumsum(rng.exponential(mean_gap, n))).astype(np.int64)


def _cumsum_by_group(group: np.ndarray, steps: np.ndarray) -> np.ndarray:
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


def _quoted(values) -> str:
    return ", ".join(f"'{v}'" for v in values)


# ------------------------------------------------------------------ finance (trades)

FINANCE_SYMBOLS = _symbols(390)


def _trades(rng, n, symbols=390, zipf=1.0, volatility=0.0008, mean_gap_ms=5.0):
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


def _tweets(rng, n, authors=2000, author_zipf=1.1, tag_zipf=1.2, mean_gap_ms=20.0):
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


def _checkpoints(rng, n, cheat=0.03, pace_s_per_km=360.0, waves=3):
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


def _rules(rng, n, att_max=50_000, types=5):
    """Cugola & Margara's base scenario: one event per tick, types uniform over A, B, C and
    noise types, `att` uniform in [1, att_max]."""
    kind = rng.integers(0, types, n)
    return {"type": _strings(RULE_TYPES[:types], kind),
            "att": rng.integers(1, att_max + 1, n, dtype=np.int64),
            "ts": np.arange(1, n + 1, dtype=np.int64)}


def _r5_query(seed: int, variant: str = "both") -> str:
    rules = {"each": "EACH", "last": "LAST"}
    chosen = list(rules) if variant == "both" else [variant]
    if any(v not in rules for v in chosen):
        raise ValueError("r5: variant is each, last or both")
    text = ["-- r5 (Cugola & Margara's base scenario): A -> B -> C with equal att, "
            "100000 ticks per step.\n-- (a.att = c.att rather than a.att = b.att: a LAST "
            "step's conditions may only read later steps; the two say the same.)"]
    for v in chosen:
        p = rules[v]
        text.append(f"QUERY r5_{v} FROM rules INTO r5_{v}\n"
                    f"DETECT C c, {p} B b WITHIN 100000 FROM c, {p} A a WITHIN 100000 FROM b\n"
                    f"WHERE a.att = c.att AND b.att = c.att\n"
                    f"EMIT att = c.att;")
    return "\n\n".join(text) + "\n"


_register(Workload("r5", "rules", "3-step TESLA rule with parameters, EACH and LAST variants",
                   _rules, _r5_query, params={"att_max": 50_000, "types": len(RULE_TYPES)},
                   options=("variant",)))


# ------------------------------------------------------------------ q9 (ticks, CQPH)

TICK_SYMBOLS = FINANCE_SYMBOLS[:30]  # the q9 queries draw from these


def _ticks(rng, n, symbols=100, zipf=1.0, volatility=0.0008, mean_gap_ms=10.0):
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


def _stocks(rng, n, tickers=10, noise=0.002):
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


def _hyper_query(seed: int, length: int | None = None, kind: str | None = None) -> str:
    """SEQ over `length` (3-7, drawn from the seed unless given) distinct tickers with
    rising opens, one of them NOT (cancelled by an open above the next step's) or
    KLEENE{1,3} (every element's open below the next step's), WITHIN length - 1 minutes
    (about one bar per ticker and step). The NOT / KLEENE sits at an inner position."""
    pick = np.random.default_rng([seed, 3_7])
    drawn_length = int(pick.integers(3, 8))
    drawn_kind = ("not", "kleene")[int(pick.integers(0, 2))]
    length = drawn_length if length is None else length
    kind = drawn_kind if kind is None else kind
    if not 3 <= length <= 7 or kind not in ("not", "kleene"):
        raise ValueError("hyper: length is 3..7 and kind is not or kleene")
    tickers = [STOCK_TICKERS[j] for j in pick.choice(len(STOCK_TICKERS), length, replace=False)]
    special = int(pick.integers(1, length - 1))  # an inner position
    names = [chr(ord("a") + i) for i in range(length)]
    steps, where, emit = [], [], []
    positive = [i for i in range(length) if not (kind == "not" and i == special)]
    for i in range(length):
        t, v = tickers[i], names[i]
        if i != special:
            steps.append(f"{t} {v}")
        elif kind == "not":
            steps.append(f"NOT({t} {v})")
            where.append(f"{v}.open > {names[positive[positive.index(i - 1) + 1]]}.open")
        else:
            steps.append(f"KLEENE({t} {v}){{1,3}}")
            where.append(f"{v}.open < {names[i + 1]}.open")
            emit.append(f"n = count({v})")
    singles = [i for i in positive if not (kind == "kleene" and i == special)]
    where[:0] = [f"{names[x]}.open < {names[y]}.open" for x, y in zip(singles, singles[1:])]
    text = (f"-- hyper (HYPERSONIC style, seed {seed}): SEQ of {length} with one "
            f"{kind.upper()}.\nQUERY hyper FROM stocks INTO hyper\n"
            f"PATTERN SEQ({', '.join(steps)})\n"
            f"{textwrap.fill('WHERE ' + ' AND '.join(where), 90, subsequent_indent='  ')}\n"
            f"WITHIN {length - 1} minutes")
    if emit:
        text += f"\nEMIT {', '.join(emit)}"
    return text + ";\n"


_register(Workload("hyper", "stocks", "SEQ of 3-7 tickers with one NOT or KLEENE (seeded)",
                   _stocks, _hyper_query, params={"tickers": 10, "noise": 0.002},
                   options=("length", "kind")))


# ------------------------------------------------------------------ writing events


def write_events(table: pa.Table, path: str | Path, fmt: str | None = None) -> Path:
    """Write a generated table as Parquet or JSON lines (by `fmt`, else by suffix)."""
    path = Path(path)
    fmt = fmt or {".parquet": "parquet", ".jsonl": "jsonl"}.get(path.suffix.lower())
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif fmt == "jsonl":
        with open(path, "wb") as f:
            for batch in table.to_batches(max_chunksize=1 << 20):
                f.write(_jsonl_lines(batch))
    else:
        raise ValueError(f"unknown event format {fmt!r} (one of {', '.join(FORMATS)})")
    return path


def _jsonl_lines(batch: pa.RecordBatch) -> bytes:
    """One JSON object per row, built column-wise. Strings that would need escaping are
    never generated here; if one is, the batch falls back to orjson row by row."""
    pieces: list = []
    for i, (name, column) in enumerate(zip(batch.schema.names, batch.columns)):
        pieces.append(("{" if i == 0 else ",") + f'"{name}":')
        if pa.types.is_string(column.type):
            if pc.any(pc.match_substring_regex(column, r'[\x00-\x1f"\\]')).as_py():
                return b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
                                for row in batch.to_pylist())
            pieces += ['"', column, '"']
        elif pa.types.is_floating(column.type):
            text = column.cast(pa.string())
            pieces.append(pc.if_else(pc.match_substring_regex(text, "[.eEn]"), text,
                                     pc.binary_join_element_wise(text, ".0", "")))
        elif pa.types.is_boolean(column.type):
            pieces.append(pc.if_else(column, "true", "false"))
        else:
            pieces.append(column.cast(pa.string()))
    pieces.append("}\n")
    arrays = [p if isinstance(p, (pa.Array, pa.ChunkedArray)) else
              pa.scalar(p, pa.string()) for p in pieces]
    lines = pc.binary_join_element_wise(*arrays, "")
    if len(lines) == 0:
        return b""
    _validity, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    return data.to_pybytes()[bounds[0]:bounds[-1]]
