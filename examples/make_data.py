"""Write the sample event files under examples/data/ (JSON lines, one file per stream).

Deterministic (fixed seed): running it again gives the same bytes. Each file is shaped so
that every query of the matching examples/*.cep file finds at least one composite event:

    python examples/make_data.py            # writes examples/data/<stream>.jsonl
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import orjson

SEED = 20240102
T0 = 1_704_187_800_000  # 2024-01-02T09:30:00Z in ms
SECOND, MINUTE = 1_000, 60_000
DATA = Path(__file__).resolve().parent / "data"


def write(stream: str, events: list[dict]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / f"{stream}.jsonl", "wb") as f:
        f.writelines(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE) for event in events)
    print(f"examples/data/{stream}.jsonl: {len(events)} events")


def by_time(events: list[dict], time: str = "ts") -> list[dict]:
    return sorted(events, key=lambda e: e[time])  # stable: ties keep generation order


def trades(rng: random.Random) -> list[dict]:
    """Random walks per symbol, with a few planted M-shapes (double tops)."""
    price = {"GOOG": 14_000, "AAPL": 19_000, "YHOO": 900, "MSFT": 37_000}
    m_shape = [0, 60, 120, 80, 30, 90, 150, 100, -50]  # start, rise, drop, rise, drop, deep
    out, ts = [], T0
    planted = {120: "GOOG", 500: "AAPL", 900: "YHOO"}
    while len(out) < 1_200:
        if len(out) in planted:
            symbol = planted[len(out)]
            base = price[symbol]
            for step in m_shape:
                ts += rng.randint(200, 1_500)
                out.append({"symbol": symbol, "price": base + step,
                            "volume": rng.randint(1, 500), "ts": ts, "seqNum": len(out)})
            price[symbol] = base + m_shape[-1]
            continue
        symbol = rng.choice(list(price))
        price[symbol] = max(100, price[symbol] + rng.choice([-30, -20, -10, 0, 10, 20, 30]))
        ts += rng.randint(200, 3_000)
        out.append({"symbol": symbol, "price": price[symbol], "volume": rng.randint(1, 500),
                    "ts": ts, "seqNum": len(out)})
    return out


CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan"]


def checkpoints(rng: random.Random) -> list[dict]:
    """Runners passing the five checkpoints; every 12th runner skips one (a cheater)."""
    out = []
    for runner in range(1, 121):
        route = list(CHECKPOINTS)
        if runner % 12 == 0:
            del route[rng.choice([1, 2, 3])]  # skip Brooklyn, Queens or the Bronx
        ts = T0 + rng.randint(0, 10 * MINUTE)
        pace = rng.randint(25, 60) * MINUTE
        for checkpoint in route:
            out.append({"runner": runner, "checkpoint": checkpoint, "ts": ts})
            ts += pace + rng.randint(-5, 5) * MINUTE
    return by_time(out)


def stocks(rng: random.Random) -> list[dict]:
    """Minute bars of five tickers; the bars of one minute share ts, in shuffled order."""
    opens = {t: 100.0 + rng.uniform(-1, 1) for t in ["AAPL", "AMZN", "AVID", "GOOG", "MSFT"]}
    out = []
    for minute in range(150):
        tickers = list(opens)
        rng.shuffle(tickers)
        for ticker in tickers:
            o = round(opens[ticker] + rng.uniform(-0.8, 0.8), 2)
            opens[ticker] = o
            c = round(o + rng.uniform(-0.5, 0.5), 2)
            out.append({"ticker": ticker, "ts": T0 + minute * MINUTE, "open": o,
                        "peak": round(max(o, c) + rng.uniform(0, 0.3), 2),
                        "low": round(min(o, c) - rng.uniform(0, 0.3), 2), "close": c,
                        "volume": rng.randint(1_000, 50_000)})
    return out


def rfid(rng: random.Random) -> list[dict]:
    """Items ordered (sometimes twice or three times), received, sometimes cancelled,
    dispatched; now and then too slowly for the one-hour window."""
    out = []
    for item in range(1, 301):
        t = T0 + item * 10 * MINUTE + rng.randint(0, 5 * MINUTE)
        out.append({"type": "O", "item": item, "ts": t})
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            t += rng.randint(1, 5) * MINUTE
            out.append({"type": "O", "item": item, "ts": t})
        t += rng.randint(5, 20) * MINUTE
        out.append({"type": "R", "item": item, "ts": t})
        if rng.random() < 0.2:
            t += rng.randint(1, 5) * MINUTE
            out.append({"type": "C", "item": item, "ts": t})
        t += rng.randint(5, 20) * MINUTE if rng.random() < 0.9 else 70 * MINUTE
        out.append({"type": "D", "item": item, "ts": t})
    return by_time(out)


def sensors(rng: random.Random) -> list[dict]:
    """Temp readings every 30 s per area; four fires heat an area for 8 minutes and end in
    smoke; a few false smoke alarms in cool areas."""
    areas = ["hall", "lab", "kitchen", "store", "office"]
    fires = {("lab", 40), ("kitchen", 90), ("store", 140), ("lab", 170)}  # (area, minute)
    alarms = {("office", 60), ("hall", 120)}
    out = []
    for half_minute in range(2 * 200):
        minute = half_minute / 2
        ts = T0 + half_minute * 30 * SECOND
        for area in areas:
            hot = any(a == area and start - 8 <= minute < start for a, start in fires)
            value = rng.uniform(48, 70) if hot else rng.uniform(18, 32)
            out.append({"kind": "Temp", "area": area, "value": round(value, 1),
                        "ts": ts + rng.randint(0, 20 * SECOND)})
            if (area, minute) in fires or (area, minute) in alarms:
                out.append({"kind": "Smoke", "area": area, "value": 1.0,
                            "ts": ts + 25 * SECOND})
    return by_time(out)


def abc(rng: random.Random) -> list[dict]:
    """Random A, B and C events (p in 1..5, v in 0..20), one every 5 to 35 seconds."""
    out, ts = [], T0
    for _ in range(1_000):
        ts += rng.randint(5, 35) * SECOND
        out.append({"type": rng.choice("AABBC"), "p": rng.randint(1, 5),
                    "v": rng.randint(0, 20), "ts": ts})
    return out


def bids(rng: random.Random) -> list[dict]:
    """Auction bids with ISO-8601 timestamps (converted to ms on input)."""
    bidders = ["alice", "bob", "carol", "dave", "erin"]
    out, ts = [], T0
    for _ in range(600):
        ts += rng.randint(1, 12) * SECOND + rng.randint(0, 999)
        when = datetime.fromtimestamp(ts / 1000, tz=UTC)
        out.append({"bidder": rng.choice(bidders), "bid_price": rng.randint(50, 500),
                    "timestamp": when.isoformat(timespec="milliseconds").replace("+00:00", "Z")})
    return out


def ticks(rng: random.Random) -> list[dict]:
    """Ticks of five symbols over 20 minutes; YHOO trades around 10 (price < 10 passes)."""
    price = {"GOOG": 140.0, "AAPL": 190.0, "YHOO": 10.0, "MSFT": 370.0, "IBM": 160.0}
    out, ts = [], T0
    for _ in range(800):
        ts += rng.randint(500, 2_500)
        symbol = rng.choice(list(price))
        price[symbol] = round(max(1.0, price[symbol] * (1 + rng.uniform(-0.004, 0.004))), 2)
        out.append({"symbol": symbol, "price": price[symbol], "volume": rng.randint(1, 300),
                    "time": ts})
    return out


def main() -> None:
    rng = random.Random(SEED)
    for stream, make in [("trades", trades), ("checkpoints", checkpoints), ("stocks", stocks),
                         ("rfid", rfid), ("sensors", sensors), ("abc", abc), ("bids", bids),
                         ("ticks", ticks)]:
        write(stream, make(rng))


if __name__ == "__main__":
    main()
