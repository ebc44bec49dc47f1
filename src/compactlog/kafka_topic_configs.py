"""Kafka's topic configs: the whole list, and the declarations of those that are about a
batch's format and timestamps or about a cluster of brokers rather than about the log.

Invariant: `KAFKA_TOPIC_CONFIGS` is exactly the set of topic configs Kafka defines (the
`define(...)` calls of Kafka's LogConfig, `KAFKA_SOURCE`), and every one of them is a key
of `compactlog.config.TOPIC_KEYS`: accepted, validated by Kafka's type and range, stored,
described (DescribeConfigs, `topics describe`) and listed in docs/configuration.md's
table. A key with `no_effect` is stored and described but changes nothing on a single
compactlog server, and its text says why; the others act as in Kafka. The log's own keys
(segments, retention, compaction, flushing) are declared in config.py.
"""

from __future__ import annotations

import re
from typing import Any

from compactlog.config_key import LONG_MAX, ConfigKey

KAFKA_SOURCE = (
    "apache/kafka, storage/src/main/java/org/apache/kafka/storage/internals/log/"
    "LogConfig.java (the `define` calls of its ConfigDef) and clients/src/main/java/"
    "org/apache/kafka/common/config/TopicConfig.java, at commit 1eb7644 (October 2024, "
    "Kafka 4.0 in development; the 3.x topic configs plus compression.*.level)"
)

# In LogConfig's order. Kept by hand from KAFKA_SOURCE; tests/core/test_kafka_topic_configs.py
# checks that docs/configuration.md's table lists exactly these, and that each is a key.
KAFKA_TOPIC_CONFIGS: tuple[str, ...] = (
    "segment.bytes",
    "segment.ms",
    "segment.jitter.ms",
    "segment.index.bytes",
    "flush.messages",
    "flush.ms",
    "retention.bytes",
    "retention.ms",
    "max.message.bytes",
    "index.interval.bytes",
    "delete.retention.ms",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "file.delete.delay.ms",
    "min.cleanable.dirty.ratio",
    "cleanup.policy",
    "unclean.leader.election.enable",
    "min.insync.replicas",
    "compression.type",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.zstd.level",
    "preallocate",
    "message.format.version",
    "message.timestamp.type",
    "message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
    "message.downconversion.enable",
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
)

# Kafka's BrokerCompressionType names; the value is the batch attributes' codec id.
TOPIC_CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PRODUCER_CODEC = "producer"

_NO_REPLICAS = ("a compactlog server is the only replica of its partitions, so there is "
                "no other replica")
_NO_INDEX = ("compactlog keeps no offset or time index files of Kafka's kind: a log "
             "segment's batches are indexed in memory, and sealed segments are searched "
             "through their Parquet row-group statistics")
_NO_LEVELS = ("the server recompresses batches with aiokafka's batch builder, which "
              "compresses at the codec's default level")
_NO_TIERS = ("Kafka's tiered storage (KIP-405) is per topic; compactlog keeps a whole "
             "store on a local disk or in an object store, chosen per server "
             "(docs/object-storage.md), with no local tier to retain")


def _kafka_version(value: str) -> str | None:
    # Kafka's MetadataVersionValidator takes versions such as 2.8, 3.0-IV1, 0.10.0.
    if re.fullmatch(r"\d+\.\d+(\.\d+)?(-IV\d+)?", value):
        return None
    return "must be a Kafka version such as 3.0 or 3.0-IV1"


def _throttled_replicas(value: str) -> str | None:
    # Kafka's ThrottledReplicaListValidator: `*`, or PARTITION:BROKER pairs.
    items = [item for item in value.split(",") if item]
    if items == ["*"] or all(re.fullmatch(r"\d+:\d+", item) for item in items):
        return None
    return "must be * or a list of PARTITION:BROKER pairs"


def _stored(name: str, type_: str, default: Any, reason: str, **limits: Any) -> ConfigKey:
    """A Kafka config that is stored and described and has no effect here."""
    doc = f"Kafka's {name}. Stored and described, no effect here: {reason}."
    return ConfigKey(name, type_, default, doc, kafka_default=default, no_effect=reason,
                     **limits)


def _before_after(direction: str) -> str:
    return (f"On a CreateTime topic, a produced record whose timestamp is more than this many "
            f"ms {direction} the server's clock is refused with INVALID_TIMESTAMP (error 32), "
            "and its whole batch with it, as Kafka's LogValidator refuses it; the CLI and "
            "Python API's appends are checked the same way. Long.MAX: no limit of its own "
            "(message.timestamp.difference.max.ms then applies, as in Kafka).")


FORMAT_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "compression.type", "string", PRODUCER_CODEC,
        "The codec of the topic's record batches, as in Kafka. `producer` keeps the codec "
        "each producer chose. `uncompressed`, `gzip`, `snappy`, `lz4` or `zstd`: a produced "
        "batch with another codec is recompressed with this one before it is appended "
        "(Kafka's LogValidator), so the batches a consumer fetches from the log segments "
        "carry it in their attributes. Sealed segments and the compacted ledger hold "
        "decoded records in Parquet (compressed by parquet.compression); Fetch rebuilds "
        "their batches compressed with this codec, or uncompressed with `producer`.",
        choices=(*TOPIC_CODECS, PRODUCER_CODEC), kafka_default=PRODUCER_CODEC,
    ),
    _stored("compression.gzip.level", "int", -1, _NO_LEVELS, minimum=1, maximum=9,
            allow_minus_one=True, minus_one_means="gzip's default level"),
    _stored("compression.lz4.level", "int", 9, _NO_LEVELS, minimum=1, maximum=17),
    _stored("compression.zstd.level", "int", 3, _NO_LEVELS, minimum=-131072, maximum=22),
    ConfigKey(
        "message.timestamp.type", "string", "CreateTime",
        "`CreateTime`: a record keeps the timestamp its producer gave it. `LogAppendTime`: "
        "the server stamps each appended batch with its clock, as Kafka does: the batch's "
        "timestamp type becomes LogAppendTime and its max timestamp the time of the "
        "append, which consumers read as every record's timestamp; the ProduceResponse "
        "returns it (log_append_time_ms), and sealed segments, the compacted view and "
        "the tables keep it. A producer's batch that claims LogAppendTime on a CreateTime "
        "topic is refused with INVALID_TIMESTAMP, as in Kafka.",
        choices=("CreateTime", "LogAppendTime"), kafka_default="CreateTime",
    ),
    ConfigKey(
        "message.timestamp.difference.max.ms", "long", LONG_MAX,
        "Kafka's older limit (deprecated by KIP-937): the most a CreateTime record's "
        "timestamp may differ from the server's clock either way; it applies where "
        "message.timestamp.before.max.ms or message.timestamp.after.max.ms is left at "
        "Long.MAX, as in Kafka's LogConfig. Refused records get INVALID_TIMESTAMP.",
        minimum=0, maximum=LONG_MAX, kafka_default=LONG_MAX,
    ),
    ConfigKey("message.timestamp.before.max.ms", "long", LONG_MAX, _before_after("before"),
              minimum=0, maximum=LONG_MAX, kafka_default=LONG_MAX),
    ConfigKey("message.timestamp.after.max.ms", "long", LONG_MAX, _before_after("after"),
              minimum=0, maximum=LONG_MAX, kafka_default=LONG_MAX),
)

STORED_KEYS: tuple[ConfigKey, ...] = (
    _stored("segment.jitter.ms", "long", 0,
            "a log segment rolls at segment.ms exactly; Kafka's jitter spreads the rolls of "
            "many partitions, and here sealing a rolled segment happens after the append "
            "that rolled it, off the produce path", minimum=0, maximum=LONG_MAX),
    _stored("segment.index.bytes", "int", 10 * 1024 * 1024, _NO_INDEX,
            minimum=4, maximum=2**31 - 1),
    _stored("index.interval.bytes", "int", 4096, _NO_INDEX, minimum=0, maximum=2**31 - 1),
    _stored("unclean.leader.election.enable", "boolean", False,
            _NO_REPLICAS + " that could be elected"),
    _stored("min.insync.replicas", "int", 1,
            _NO_REPLICAS + "; acks=all waits for the flush policy on a local disk and for "
            "the object store on S3 (docs/server.md)", minimum=1, maximum=2**31 - 1),
    _stored("preallocate", "boolean", False,
            "log segment files grow as batches are appended, and sealed segments are "
            "Parquet files written once"),
    _stored("message.format.version", "string", "3.0-IV1",
            "deprecated in Kafka (KIP-724); compactlog stores and serves v2 record "
            "batches (magic 2) only", validator=_kafka_version,
            allowed_text="a Kafka version such as 3.0 or 3.0-IV1"),
    _stored("leader.replication.throttled.replicas", "list", "",
            _NO_REPLICAS + " to throttle", validator=_throttled_replicas,
            allowed_text="* or a list of PARTITION:BROKER pairs"),
    _stored("follower.replication.throttled.replicas", "list", "",
            _NO_REPLICAS + " to throttle", validator=_throttled_replicas,
            allowed_text="* or a list of PARTITION:BROKER pairs"),
    _stored("message.downconversion.enable", "boolean", True,
            "deprecated in Kafka (KIP-724); compactlog serves v2 record batches only and "
            "never down-converts"),
    _stored("remote.storage.enable", "boolean", False, _NO_TIERS),
    _stored("local.retention.ms", "long", -2, _NO_TIERS, minimum=-2, maximum=LONG_MAX),
    _stored("local.retention.bytes", "long", -2, _NO_TIERS, minimum=-2, maximum=LONG_MAX),
    _stored("remote.log.copy.disable", "boolean", False, _NO_TIERS),
    _stored("remote.log.delete.on.disable", "boolean", False, _NO_TIERS),
)
