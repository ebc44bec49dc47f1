"""Stock-ticker updates: the demo's data, and JSON lines for `compactlog produce`.

Each update is one price for a symbol. Popular symbols trade far more often than the
tail (a Zipf-like skew). A few symbols are delisted along the way: their last record is
a tombstone (a null value), which deletes the key from the compacted view. The output
is deterministic for a given seed.

    python examples/stock_ticker.py --symbols 3000 --updates 200000 | compactlog produce ticks
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import string
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Tick:
    symbol: str
    update: dict[str, object] | None  # None: the symbol is delisted (a tombstone)
    timestamp_ms: int

    @property
    def value(self) -> bytes | None:
        return None if self.update is None else json.dumps(self.update).encode()


def symbols(count: int, rng: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choices(string.ascii_uppercase, k=rng.randint(2, 5))))
    return sorted(names)


def ticks(symbol_count: int, updates: int, delist: float = 0.02, seed: int = 7) -> Iterator[Tick]:
    """`updates` price updates, plus one tombstone per delisted symbol."""
    rng = random.Random(seed)
    tickers = symbols(symbol_count, rng)
    rng.shuffle(tickers)  # popularity is not alphabetical
    prices = {s: round(rng.uniform(5, 500), 2) for s in tickers}
    weight = {symbol: 1.0 / (rank + 1) ** 0.8 for rank, symbol in enumerate(tickers)}
    delisted = rng.sample(tickers, int(len(tickers) * delist))
    by_step: dict[int, list[str]] = {}
    for symbol in delisted:
        by_step.setdefault(rng.randint(updates // 2, updates - 1), []).append(symbol)
    live = list(tickers)
    cumulative = list(itertools.accumulate(weight[s] for s in live))
    start_ms = int(time.time() * 1000) - updates
    for step in range(updates):
        symbol = rng.choices(live, cum_weights=cumulative)[0]
        price = max(0.01, round(prices[symbol] * (1 + rng.gauss(0, 0.002)), 2))
        prices[symbol] = price
        yield Tick(symbol, {"symbol": symbol, "price": price,
                            "volume": rng.randint(1, 5000), "seq": step}, start_ms + step)
        for gone in by_step.get(step, []):
            live.remove(gone)
            cumulative = list(itertools.accumulate(weight[s] for s in live))
            yield Tick(gone, None, start_ms + step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", type=int, default=3000, help="distinct ticker symbols")
    parser.add_argument("--updates", type=int, default=200_000, help="price updates to emit")
    parser.add_argument("--delist", type=float, default=0.02, help="share of symbols delisted")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for tick in ticks(args.symbols, args.updates, args.delist, args.seed):
        line: dict[str, object] = {"key": tick.symbol, "timestamp": tick.timestamp_ms}
        line["value"] = None if tick.update is None else json.dumps(tick.update)
        if tick.update is not None:
            line["headers"] = {"source": "demo"}
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
