"""Compaction settings that run code are the server's to allow.

Invariant: a topic config that a Kafka client sends (CreateTopics, AlterConfigs,
IncrementalAlterConfigs) gets a `function:MODULE:NAME` compaction strategy only if
the server's config lists `MODULE:NAME` in `compaction.allowed_strategy_functions`;
any other is refused with INVALID_CONFIG and a message naming the setting (not what it
lists), before anything is validated further or stored. The check reads the strategy's
text only: nothing named is imported (the compaction process imports a strategy's
module when it runs). This holds whether or not the authorizer is on: ACLs say who may
change a topic's config, this says what code a config may name at all.

The server's cleaner applies the same list before it starts a run (server/cleaner.py):
a topic whose strategy names a function not listed (set before the list existed, or by
a local `compactlog topics alter`) gets a failed run that says why, and no compaction
process, so the server never imports code its config does not name. A local
`compactlog compact` is the operator's own command and is not limited.

The other code a compaction may run, the compaction service factory, is named by an
import path only in the server's own config (`compaction.service`) or on the command
line of a local `compactlog compact`: no client request can name one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from compactlog.errors import InvalidConfigError
from compactlog.strategy import StrategyError, parse_strategy

STRATEGY_KEY = "compaction.strategy"


def check_allow_list(entries: Iterable[str]) -> None:
    """ValueError naming the first entry that is not `MODULE:NAME` (checked at start, so
    a typo is not found only when a client is refused)."""
    for entry in entries:
        try:
            parse_strategy(f"function:{entry}")
        except StrategyError:
            raise ValueError(
                f"compaction.allowed_strategy_functions: {entry!r} is not MODULE:NAME "
                "(as in a topic's compaction.strategy function:MODULE:NAME)") from None


def check_strategy(value: str | None, allowed: Iterable[str]) -> None:
    """InvalidConfigError if `value` names a function strategy the server does not allow
    (a value that does not parse is left to the config's own validation)."""
    if value is None:
        return
    try:
        strategy = parse_strategy(value)
    except StrategyError:
        return
    if strategy.kind != "function":
        return
    if strategy.function in set(allowed):
        return
    # The allow-list is not echoed: it names code the server runs, the operator's to know.
    raise InvalidConfigError(
        STRATEGY_KEY, value,
        f"function {strategy.function} is not allowed by this server; a function: "
        f"strategy runs code in the compaction process, so the server's config must list "
        f"it in compaction.allowed_strategy_functions")


def check_configs(configs: Mapping[str, str | None], allowed: Iterable[str]) -> None:
    """check_strategy on a request's topic configs, by Kafka's names."""
    if STRATEGY_KEY in configs:
        check_strategy(configs[STRATEGY_KEY], allowed)
