"""Generate stock-ticker updates as JSON lines for `compactlog produce`.

Each line is one price update for a symbol. A few symbols are delisted along the way:
their last record is a tombstone ("value": null), which deletes the key from the
compacted view. The output is deterministic for a given --seed.

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


def symbols(count: int, rng: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choices(string.ascii_uppercase, k=rng.randint(2, 5))))
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", type=int, default=3000, help="distinct ticker symbols")
    parser.add_argument("--updates", type=int, default=200_000, help="price updates to emit")
    parser.add_argument("--delist", type=float, default=0.02, help="share of symbols delisted")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    tickers = symbols(args.symbols, rng)
    prices = {s: round(rng.uniform(5, 500), 2) for s in tickers}
    # Popular symbols trade far more often than the tail (a Zipf-like skew).
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(tickers))]
    delisted = set(rng.sample(tickers, int(len(tickers) * args.delist)))
    delist_at = {s: rng.randint(args.updates // 2, args.updates - 1) for s in delisted}
    by_step: dict[int, list[str]] = {}
    for symbol, step in delist_at.items():
        by_step.setdefault(step, []).append(symbol)
    live = list(tickers)
    cumulative = list(itertools.accumulate(weights))
    start_ms = int(time.time() * 1000) - args.updates
    out = sys.stdout
    for step in range(args.updates):
        symbol = rng.choices(live, cum_weights=cumulative)[0]
        price = max(0.01, round(prices[symbol] * (1 + rng.gauss(0, 0.002)), 2))
        prices[symbol] = price
        update = {"symbol": symbol, "price": price, "volume": rng.randint(1, 5000), "seq": step}
        out.write(json.dumps({"key": symbol, "value": json.dumps(update),
                              "headers": {"source": "demo"}, "timestamp": start_ms + step}))
        out.write("\n")
        for gone in by_step.get(step, []):
            live.remove(gone)
            cumulative = list(itertools.accumulate(weights[: len(live)]))
            out.write(json.dumps({"key": gone, "value": None, "timestamp": start_ms + step}))
            out.write("\n")


if __name__ == "__main__":
    main()
