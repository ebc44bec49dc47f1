"""Topic config keys: defaults, parsing, validation messages, normalisation, altering."""

from __future__ import annotations

import math

import pytest

from compactlog.config import (
    INT_MAX,
    LONG_MAX,
    TOPIC_KEYS,
    TOPIC_KEYS_BY_NAME,
    ConfigKey,
    TopicConfig,
    lookup,
    parse_assignments,
    validate_overrides,
)
from compactlog.errors import InvalidConfigError, UnknownConfigError, UserError

NUMERIC_KEYS = [key for key in TOPIC_KEYS if key.type in ("int", "long", "double")]
CHOICE_KEYS = [key for key in TOPIC_KEYS if key.choices is not None]
UNLIMITED_KEYS = [key for key in TOPIC_KEYS if key.allow_minus_one]


def ids(keys: list[ConfigKey]) -> list[str]:
    return [key.name for key in keys]


def render(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def assert_names(error: InvalidConfigError, key: ConfigKey, raw: object) -> None:
    message = str(error)
    assert error.key == key.name
    assert error.value == raw or (isinstance(raw, float) and math.isnan(raw))
    assert key.name in message, message
    assert repr(raw) in message, message
    assert key.allowed() in message or "true or false" in message, message


def test_keys_are_unique_and_complete() -> None:
    names = [key.name for key in TOPIC_KEYS]
    assert len(names) == len(set(names))
    assert set(TOPIC_KEYS_BY_NAME) == set(names)
    types = {"long", "int", "double", "boolean", "string", "list"}
    assert {key.type for key in TOPIC_KEYS} <= types


@pytest.mark.parametrize("key", TOPIC_KEYS, ids=ids(list(TOPIC_KEYS)))
def test_every_key_parses_its_default(key: ConfigKey) -> None:
    assert key.parse(key.default) == key.default
    # The string form, as given on the command line or in a Kafka CreateTopics request.
    parsed = key.parse(render(key.default))
    assert parsed == key.default
    assert type(parsed) is type(key.default)
    assert TopicConfig({})[key.name] == key.default
    assert TopicConfig.from_strings({key.name: render(key.default)})[key.name] == key.default


def test_effective_config_is_all_defaults() -> None:
    assert TopicConfig({}).effective() == {key.name: key.default for key in TOPIC_KEYS}
    assert TopicConfig({}).cleanup_policy == "delete"
    assert not TopicConfig({}).compacted


@pytest.mark.parametrize("key", NUMERIC_KEYS, ids=ids(NUMERIC_KEYS))
def test_range_edges(key: ConfigKey) -> None:
    assert key.minimum is not None and key.maximum is not None
    assert key.parse(str(_fmt(key.minimum))) == key.minimum
    assert key.parse(str(_fmt(key.maximum))) == key.maximum
    below = _below(key)
    with pytest.raises(InvalidConfigError) as error:
        key.parse(below)
    assert_names(error.value, key, below)
    above = _above(key)
    with pytest.raises(InvalidConfigError) as error:
        key.parse(above)
    assert_names(error.value, key, above)


def _fmt(number: float) -> int | float:
    return int(number) if float(number).is_integer() else number


def _below(key: ConfigKey) -> str:
    assert key.minimum is not None
    if key.type == "double":
        return str(key.minimum - 0.25)
    value = int(key.minimum) - 1
    if key.allow_minus_one and value == -1:
        value = -2
    return str(value)


def _above(key: ConfigKey) -> str:
    assert key.maximum is not None
    if key.type == "double":
        return str(key.maximum + 0.25)
    return str(int(key.maximum) + 1)


@pytest.mark.parametrize("key", UNLIMITED_KEYS, ids=ids(UNLIMITED_KEYS))
def test_minus_one_means_unlimited_where_allowed(key: ConfigKey) -> None:
    assert key.parse("-1") == -1
    assert key.parse(-1) == -1
    assert f"-1 for {key.minus_one_means}" in key.allowed()


@pytest.mark.parametrize(
    "name", ["segment.bytes", "segment.ms", "min.cleanable.dirty.ratio", "max.message.bytes"]
)
def test_minus_one_refused_elsewhere(name: str) -> None:
    key = lookup(name)
    with pytest.raises(InvalidConfigError) as error:
        key.parse("-1")
    assert_names(error.value, key, "-1")


def test_int_keys_stop_at_int_max() -> None:
    key = lookup("segment.bytes")
    assert key.parse(str(INT_MAX)) == INT_MAX
    with pytest.raises(InvalidConfigError):
        key.parse(str(INT_MAX + 1))
    assert lookup("segment.ms").parse(str(LONG_MAX)) == LONG_MAX
    with pytest.raises(InvalidConfigError):
        lookup("segment.ms").parse(str(LONG_MAX + 1))


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("segment.bytes", "abc"),
        ("segment.bytes", "1.5"),
        ("segment.bytes", ""),
        ("segment.bytes", "1e6"),
        ("segment.bytes", True),
        ("segment.bytes", None),
        ("retention.ms", "forever"),
        ("retention.bytes", "10MB"),
        ("min.cleanable.dirty.ratio", "half"),
        ("min.cleanable.dirty.ratio", True),
        ("min.cleanable.dirty.ratio", None),
        ("empty.value.is.tombstone", "yes"),
        ("empty.value.is.tombstone", "1"),
        ("empty.value.is.tombstone", ""),
        ("cleanup.policy", "remove"),
        ("cleanup.policy", "delete,remove"),
        ("cleanup.policy", ""),
        ("null.key.policy", "ignore"),
        ("null.key.policy", "REJECT"),
        ("parquet.compression", "brotli"),
    ],
)
def test_wrong_type_or_choice_names_key_value_and_allowed(name: str, raw: object) -> None:
    key = lookup(name)
    with pytest.raises(InvalidConfigError) as error:
        key.parse(raw)
    assert_names(error.value, key, raw)
    # The same through the public entry points.
    with pytest.raises(InvalidConfigError):
        TopicConfig.from_strings({name: raw})
    with pytest.raises(InvalidConfigError):
        validate_overrides({name: raw})


@pytest.mark.parametrize("raw", ["nan", "NaN", float("nan")])
def test_nan_ratio_is_out_of_range(raw: object) -> None:
    """NaN is not in [0, 1]; it compares False with both bounds and must still be refused."""
    key = lookup("min.cleanable.dirty.ratio")
    with pytest.raises(InvalidConfigError) as error:
        key.parse(raw)
    assert_names(error.value, key, raw)


@pytest.mark.parametrize("raw", ["inf", "-inf"])
def test_infinite_ratio_is_out_of_range(raw: str) -> None:
    with pytest.raises(InvalidConfigError):
        lookup("min.cleanable.dirty.ratio").parse(raw)


@pytest.mark.parametrize("key", CHOICE_KEYS, ids=ids(CHOICE_KEYS))
def test_every_choice_parses_and_errors_list_them(key: ConfigKey) -> None:
    assert key.choices is not None
    for choice in key.choices:
        assert key.parse(choice) == choice
    with pytest.raises(InvalidConfigError) as error:
        key.parse("not-a-choice")
    assert_names(error.value, key, "not-a-choice")
    for choice in key.choices:
        assert repr(choice) in str(error.value)


def test_parsing_normalises_types() -> None:
    assert lookup("segment.bytes").parse(" 2048 ") == 2048
    assert lookup("segment.bytes").parse(4096) == 4096
    assert lookup("min.cleanable.dirty.ratio").parse("0.25") == 0.25
    assert lookup("min.cleanable.dirty.ratio").parse(1) == 1.0
    assert lookup("empty.value.is.tombstone").parse("TRUE") is True
    assert lookup("empty.value.is.tombstone").parse(" false ") is False
    assert lookup("empty.value.is.tombstone").parse(True) is True
    assert lookup("null.key.policy").parse("keep") == "keep"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("delete,compact", "compact,delete"),
        ("compact,delete", "compact,delete"),
        (" delete , compact ", "compact,delete"),
        ("compact,compact", "compact"),
        ("delete,", "delete"),
        ("compact", "compact"),
    ],
)
def test_cleanup_policy_normalises(raw: str, expected: str) -> None:
    assert lookup("cleanup.policy").parse(raw) == expected
    config = TopicConfig.from_strings({"cleanup.policy": raw})
    assert config.cleanup_policy == expected
    assert config.compacted == ("compact" in expected)


def test_unknown_key_names_it_and_the_known_keys() -> None:
    with pytest.raises(UnknownConfigError) as error:
        lookup("retention.msec")
    message = str(error.value)
    assert error.value.key == "retention.msec"
    assert "'retention.msec'" in message
    for key in TOPIC_KEYS:
        assert key.name in message
    with pytest.raises(UnknownConfigError):
        TopicConfig.from_strings({"segment.bytes": "2048", "no.such.key": "1"})
    with pytest.raises(UnknownConfigError):
        validate_overrides({"": "1"})
    assert issubclass(UnknownConfigError, UserError)
    assert issubclass(InvalidConfigError, UserError)


def test_altered_sets_and_deletes() -> None:
    base = TopicConfig.from_strings({"segment.bytes": "2048", "cleanup.policy": "compact"})
    altered = base.altered({"retention.ms": "1000", "segment.bytes": 4096})
    assert altered["retention.ms"] == 1000
    assert altered["segment.bytes"] == 4096
    assert altered.cleanup_policy == "compact"
    # The original is a frozen value and is unchanged.
    assert base["segment.bytes"] == 2048
    assert base["retention.ms"] == lookup("retention.ms").default

    reverted = altered.altered({}, delete=["segment.bytes", "cleanup.policy"])
    assert reverted["segment.bytes"] == lookup("segment.bytes").default
    assert reverted.cleanup_policy == "delete"
    assert dict(reverted.overrides) == {"retention.ms": 1000}

    # Deleting a key that is not overridden is fine; set wins over delete for the same key.
    assert reverted.altered({}, delete=["flush.ms"]).overrides == reverted.overrides
    both = reverted.altered({"retention.ms": "5"}, delete=["retention.ms"])
    assert both["retention.ms"] == 5


def test_altered_refuses_bad_input_and_changes_nothing() -> None:
    base = TopicConfig.from_strings({"segment.bytes": "2048"})
    before = dict(base.overrides)
    with pytest.raises(UnknownConfigError):
        base.altered({}, delete=["no.such.key"])
    with pytest.raises(InvalidConfigError) as error:
        base.altered({"segment.bytes": "12"})
    assert_names(error.value, lookup("segment.bytes"), "12")
    with pytest.raises(UnknownConfigError):
        base.altered({"segment.bites": "2048"})
    assert dict(base.overrides) == before


def test_parse_assignments() -> None:
    assert parse_assignments(["a=1", " b = x=y ", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in ["novalue", "=1", " =1"]:
        with pytest.raises(UserError, match="KEY=VALUE"):
            parse_assignments([bad])


def test_a_retired_key_is_refused_when_set_and_dropped_from_a_stored_topic() -> None:
    from compactlog.storage.topic import TopicMeta

    # Set anew (create, alter): refused, naming what replaced it.
    with pytest.raises(UnknownConfigError, match=r"compaction\.without\.spark=true"):
        TopicConfig.from_strings({"compaction.inline.max.bytes": "0"})
    with pytest.raises(UnknownConfigError, match="was removed"):
        TopicConfig({}).altered({"compaction.inline.max.bytes": "0"})
    # Stored by a build that had it: the topic opens, without it.
    meta = TopicMeta.from_json({
        "name": "t", "topic_id": "x", "partitions": 1, "created_ms": 0,
        "config": {"cleanup.policy": "compact", "compaction.inline.max.bytes": 268435456}})
    assert dict(meta.config.overrides) == {"cleanup.policy": "compact"}
    assert meta.config["compaction.without.spark"] is False
