"""Every topic config key, declared once: name, type, default, allowed range and doc.

`TOPIC_KEYS` is the one list of keys: the log's own (segments, retention, compaction,
flushing, compactlog's strategies and formats) are declared here, Kafka's batch-format,
timestamp and cluster keys in kafka_topic_configs.py, which also holds the list of every
topic config Kafka defines. Where Kafka has a name for a setting, compactlog uses that
name and Kafka's meaning (https://kafka.apache.org/documentation/#topicconfigs).
Where compactlog's default differs from Kafka's, the doc text says so and why.
`docs/configuration.md` is generated from this table (`compactlog config-docs`), and a
test keeps the two equal. It is one concept past 500 lines because the table is the
point: one place to read every key of the log beside the type that checks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from compactlog.config_key import INT_MAX, LONG_MAX, ConfigKey
from compactlog.errors import RetiredConfigError, UnknownConfigError, UserError
from compactlog.kafka_topic_configs import (
    FORMAT_KEYS,
    PRODUCER_CODEC,
    STORED_KEYS,
    TOPIC_CODECS,
)
from compactlog.strategy import ALLOWED as STRATEGIES
from compactlog.strategy import validate_strategy

TOPIC_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "cleanup.policy",
        "list",
        "delete",
        "What happens to old records. `delete`: retention removes old sealed segments. "
        "`compact`: compaction keeps the latest record per key; retention removes a raw "
        "segment only once it lies wholly at or below the compaction horizon. "
        "`compact,delete`: as `compact`, and records older than retention.ms also leave "
        "the compacted view.",
        choices=("delete", "compact", "compact,delete"),
        kafka_default="delete",
    ),
    ConfigKey(
        "segment.bytes",
        "int",
        128 * 1024 * 1024,
        "The active segment is rolled and sealed into a Parquet file once it holds this many "
        "bytes. Kafka's default is 1 GiB; compactlog uses 128 MiB because only sealed segments "
        "are compacted, and a smaller active segment lets compaction catch up sooner.",
        minimum=1024,
        maximum=INT_MAX,
        kafka_default=1073741824,
    ),
    ConfigKey(
        "segment.ms",
        "long",
        24 * 3600 * 1000,
        "The active segment is rolled once it has been open this long, even if it is small. The "
        "time counts from when the segment was opened (by this process), not from its records' "
        "timestamps, so a backfill of old records makes segments of segment.bytes rather than "
        "one per append. Kafka's default is 7 days; compactlog uses 1 day so that quiet "
        "partitions still reach compaction (a known Kafka pitfall).",
        minimum=1,
        maximum=LONG_MAX,
        kafka_default=604800000,
    ),
    ConfigKey(
        "retention.ms",
        "long",
        7 * 24 * 3600 * 1000,
        "Sealed segments whose newest record is older than this leave the raw log (the log "
        "start moves past them). With cleanup.policy=delete that is all. With `compact`, only "
        "segments wholly at or below the compaction horizon may go, and the compacted view "
        "keeps their surviving records, so a key survives until a tombstone removes it. With "
        "`compact,delete`, records older than this also leave the compacted view at the next "
        "compaction, as in Kafka. -1 keeps segments forever.",
        minimum=0,
        maximum=LONG_MAX,
        allow_minus_one=True,
        kafka_default=604800000,
    ),
    ConfigKey(
        "retention.bytes",
        "long",
        -1,
        "The oldest sealed segments leave the raw log while the partition holds more than this "
        "many bytes, counting its log segments too (as Kafka counts the whole log). Log "
        "segments are never deleted, so a partition may stay above the limit until they are "
        "sealed. On compacted topics (`compact`, `compact,delete`) only segments wholly at or "
        "below the compaction horizon may go, and the compacted view keeps their surviving "
        "records; the ledger is not counted. -1 means no size limit.",
        minimum=0,
        maximum=LONG_MAX,
        allow_minus_one=True,
        kafka_default=-1,
    ),
    ConfigKey(
        "file.delete.delay.ms",
        "long",
        60_000,
        "How long a sealed segment or ledger file stays on disk after a commit stopped listing "
        "it (retention, or a compaction that replaced the ledger), so that readers which loaded "
        "the older manifest, here or in another process, can finish with it. A reader that "
        "takes longer reads again from the newer manifest.",
        minimum=0,
        maximum=LONG_MAX,
        kafka_default=60000,
    ),
    ConfigKey(
        "min.compaction.lag.ms",
        "long",
        0,
        "Records younger than this are never compacted away.",
        minimum=0,
        maximum=LONG_MAX,
        kafka_default=0,
    ),
    ConfigKey(
        "max.compaction.lag.ms",
        "long",
        LONG_MAX,
        "A partition whose oldest uncompacted record is older than this becomes eligible for "
        "compaction whatever its dirty ratio; the active segment of a compacted topic is "
        "rolled by this age too, as by segment.ms.",
        minimum=1,
        maximum=LONG_MAX,
        kafka_default=LONG_MAX,
    ),
    ConfigKey(
        "delete.retention.ms",
        "long",
        24 * 3600 * 1000,
        "How long a tombstone stays in the compacted view after the compaction that first kept "
        "it. 0 drops tombstones at once, as Pulsar does.",
        minimum=0,
        maximum=LONG_MAX,
        kafka_default=86400000,
    ),
    ConfigKey(
        "min.cleanable.dirty.ratio",
        "double",
        0.5,
        "Compaction becomes due when dirty bytes / (clean + dirty bytes) is above this ratio "
        "(strictly, as in Kafka: 1.0 turns ratio-triggered compaction off).",
        minimum=0.0,
        maximum=1.0,
        kafka_default=0.5,
    ),
    ConfigKey(
        "max.message.bytes",
        "int",
        1048588,
        "The largest record batch the topic accepts, in bytes.",
        minimum=0,
        maximum=INT_MAX,
        kafka_default=1048588,
    ),
    ConfigKey(
        "flush.messages",
        "long",
        1,
        "Appends are fsynced once this many records are unflushed. The default 1 fsyncs every "
        "batch before the append returns, so an acknowledged record survives power loss. Kafka's "
        "default is Long.MAX (leave it to the OS), because Kafka relies on replication, which a "
        "single compactlog node does not have. Set Long.MAX to leave flushing to the OS.",
        minimum=1,
        maximum=LONG_MAX,
        kafka_default=LONG_MAX,
    ),
    ConfigKey(
        "flush.ms",
        "long",
        LONG_MAX,
        "Appends are fsynced once the oldest unflushed record has waited this long.",
        minimum=0,
        maximum=LONG_MAX,
        kafka_default=LONG_MAX,
    ),
    # Kafka's batch format and timestamp configs, and those with no effect on one server.
    *FORMAT_KEYS,
    *STORED_KEYS,
    ConfigKey(
        "null.key.policy",
        "string",
        "reject",
        "compactlog: what a compacted topic does with records that have no key. `reject` "
        "refuses them at produce, as Kafka does; `drop` accepts them and compaction drops them "
        "(Pulsar's default); `keep` keeps them in the compacted view at their offsets.",
        choices=("reject", "drop", "keep"),
    ),
    ConfigKey(
        "empty.value.is.tombstone",
        "boolean",
        False,
        "compactlog: treat a record with an empty (zero-length) value as a tombstone, as "
        "Pulsar does. By default only a null value is a tombstone, as in Kafka.",
    ),
    ConfigKey(
        "compaction.strategy",
        "string",
        "latest",
        "compactlog: which record of a key survives compaction. `latest`: the greatest offset "
        "(Kafka, Pulsar). `first`: the first record (Pulsar's PIP-215). `order:timestamp`, "
        "`order:header:NAME` or `order:header:NAME:long`: the greatest ordering value, ties "
        "broken by offset. `function:MODULE:NAME`: a Python function "
        "`NAME(previous, current) -> bool` that returns True to keep `previous`; the slow "
        "path, as values then cross the cluster. With every strategy a tombstone deletes its "
        "key, and only records after it compete. A `function:` strategy runs code, so the "
        "server takes it from a Kafka client, and its cleaner runs it, only if its config "
        "lists `MODULE:NAME` in `compaction.allowed_strategy_functions` (below).",
        validator=validate_strategy,
        allowed_text=STRATEGIES,
    ),
    ConfigKey(
        "compaction.phase1.engine",
        "string",
        "auto",
        "compactlog: how the Spark service finds each key's survivor. `arrow`: one task per "
        "partition (the partitions' tasks packed into one Spark task per core) reads key, "
        "offset and tombstone flag with pyarrow, groups the keys exactly (byte for byte) "
        "and writes that partition's ledger files in the same task, "
        "so no survivor list passes through the driver. `sql`: a Spark SQL aggregation over "
        "all partitions, whose surviving offsets are collected to the driver and sent to the "
        "phase-2 tasks. `auto`: `arrow`, except for the strategies it does not run "
        "(`function:...` and `order:header:NAME:long`), which use `sql`; `arrow` falls back "
        "the same way.",
        choices=("auto", "arrow", "sql"),
    ),
    ConfigKey(
        "compaction.task.memory.bytes",
        "long",
        512 * 1024 * 1024,
        "compactlog: the memory budget of one Arrow phase-1 task (compaction.phase1.engine): "
        "what the phase-1 columns of a partition (key, offset, tombstone flag, ordering "
        "value) may take in memory while its keys are grouped, estimated from the Parquet "
        "footers at 3 times their uncompressed size. A partition over the budget is split "
        "by a hash of the key into buckets that are read and grouped one at a time (keys "
        "are still compared byte for byte within a bucket). Keep it below the memory one "
        "Spark Python worker may use (spark.executor.pyspark.memory when set, else the "
        "machine's memory divided by the executor's cores).",
        minimum=1024,
        maximum=LONG_MAX,
    ),
    ConfigKey(
        "compaction.deletion.vectors",
        "boolean",
        True,
        "compactlog: incremental compaction with deletion vectors (Arrow phase 1 only; see "
        "docs/design.md). A run reads only the key and offset columns of the previous "
        "ledger, writes ledger files for the survivors of the new segments, and for each "
        "previous ledger file that lost records writes a small file of the deleted offsets "
        "(a deletion vector) instead of rewriting it. Every reader of the compacted view "
        "filters them. `false`: every run rewrites the whole ledger.",
    ),
    ConfigKey(
        "iceberg.raw.enabled",
        "boolean",
        False,
        "compactlog: keep the topic's sealed segments as an append-only Iceberg table too, "
        "`<topic>/iceberg/raw` (docs/querying.md), synced by the server's upkeep. Off by "
        "default, as Redpanda's Iceberg topics are: each snapshot costs a few writes per "
        "changed partition. Switched off, the server drops the table (its metadata, "
        "then its files, then its holds on segments) in its next upkeep round.",
    ),
    ConfigKey(
        "iceberg.raw.target.lag.ms",
        "long",
        60_000,
        "compactlog: how long a sealed segment may wait before the raw Iceberg table lists "
        "it (Redpanda's iceberg_target_lag_ms): the server syncs the table at most this "
        "often, so a busy topic makes one snapshot per interval, not one per seal.",
        minimum=0,
        maximum=LONG_MAX,
    ),
    ConfigKey(
        "iceberg.history.expire.max-snapshot-age-ms",
        "long",
        3_600_000,
        "compactlog: how long a snapshot of the topic's Iceberg tables is kept for time "
        "travel (Iceberg's history.expire.max-snapshot-age-ms); older ones expire in the "
        "server's upkeep and after a compaction. The files a kept snapshot lists stay on "
        "disk whatever file.delete.delay.ms says, so every ledger a compaction replaced "
        "stays this long: one hour by default, not Iceberg's 5 days, so that compaction "
        "still gives space back soon; raise it for longer time travel.",
        minimum=0,
        maximum=LONG_MAX,
    ),
    ConfigKey(
        "iceberg.history.expire.min-snapshots-to-keep",
        "int",
        1,
        "compactlog: the newest snapshots of the Iceberg state table kept whatever their "
        "age (Iceberg's history.expire.min-snapshots-to-keep); the current one always is.",
        minimum=1,
        maximum=2**31 - 1,
    ),
    ConfigKey(
        "compaction.without.spark",
        "boolean",
        False,
        "compactlog: run this topic's compactions without Spark: the Spark service calls "
        "the same Arrow task function in the compacting process, as many partitions at once "
        "as the master has cores (this machine's for a master that is not local), with the "
        "same files and commit, and starts no JVM. For tests and embedded use; by default "
        "every compaction is a Spark job. The report's engine then says `in this process, "
        "no Spark job` and its stages `inline: read`, `inline: group` and `inline: write`. "
        "A strategy that only the SQL pipeline runs (`function:...`, "
        "`order:header:NAME:long`) or compaction.phase1.engine=sql cannot run without "
        "Spark: such a run fails and says so.",
    ),
    ConfigKey(
        "compaction.ledger.rewrite.live.fraction",
        "double",
        0.5,
        "compactlog: with compaction.deletion.vectors, a ledger file whose live records "
        "fall below this fraction of its rows is rewritten (its live rows copied to a new "
        "file, its deletion vector dropped) rather than given a larger deletion vector. "
        "0 never rewrites a file that still holds a live record; 1 rewrites every file "
        "that lost one.",
        minimum=0.0,
        maximum=1.0,
    ),
    ConfigKey(
        "compaction.ledger.merge.below.bytes",
        "long",
        16 * 1024 * 1024,
        "compactlog: with compaction.deletion.vectors, a ledger file smaller than this is "
        "small, and small neighbours in offset order of like size merge: walking back from "
        "the newest, a file joins the newer files' group while it is at most twice what "
        "they hold together, and a group of at least compaction.ledger.merge.min.files is "
        "rewritten (its live records copied into new files of up to the ledger's file "
        "size, with the run's new survivors when those come next). Every incremental run "
        "adds a ledger file per partition: without merging they would stay files of their "
        "own while they keep half their records. A file is rewritten again only once the "
        "data after it has grown to half its size. 0: never merge.",
        minimum=0,
        maximum=LONG_MAX,
    ),
    ConfigKey(
        "compaction.ledger.merge.min.files",
        "int",
        5,
        "compactlog: the fewest small ledger files (compaction.ledger.merge.below.bytes) "
        "that merge together, as Iceberg's rewrite_data_files' min-input-files: a smaller "
        "group stays as it is, so that a run does not rewrite its previous output every "
        "time.",
        minimum=2,
        maximum=2**31 - 1,
    ),
    ConfigKey(
        "compaction.segment.adopt.min.bytes",
        "long",
        1024 * 1024,
        "compactlog: with compaction.deletion.vectors, a sealed segment of at least this "
        "many bytes of which at least compaction.segment.adopt.live.fraction of the records "
        "survive joins the ledger as it is, with a deletion vector for the records that do "
        "not (on a local disk a hard link to the segment's file, on S3 a copy within the "
        "bucket: nothing is decoded, encoded or sent), rather than having its survivors "
        "copied into a new ledger file. Smaller segments are copied, so that the ledger "
        "does not fill with small files. -1: never adopt.",
        minimum=0,
        maximum=LONG_MAX,
        allow_minus_one=True,
        minus_one_means="never adopting",
    ),
    ConfigKey(
        "compaction.segment.adopt.live.fraction",
        "double",
        0.9,
        "compactlog: the share of a sealed segment's records that must survive for it to be "
        "adopted into the ledger as it is (see compaction.segment.adopt.min.bytes), and never "
        "less than compaction.ledger.rewrite.live.fraction (else the next run would rewrite "
        "it). An adopted file keeps its superseded records' bytes until it is rewritten, and "
        "every later run reads their keys: 0.9 bounds that to about a tenth.",
        minimum=0.0,
        maximum=1.0,
    ),
    ConfigKey(
        "parquet.row.group.bytes",
        "int",
        4 * 1024 * 1024,
        "compactlog: target size of one Parquet row group in a sealed segment, in uncompressed "
        "record bytes. A read seeks to the row group that holds its offset through the row "
        "groups' offset statistics, so smaller groups mean finer seeks and larger footers.",
        minimum=64 * 1024,
        maximum=1024 * 1024 * 1024,
    ),
    ConfigKey(
        "parquet.compression",
        "string",
        "zstd",
        "compactlog: the Parquet codec of sealed segments. Spark, DuckDB and Polars read all "
        "of these.",
        choices=("none", "snappy", "zstd", "lz4", "gzip"),
    ),
)

TOPIC_KEYS_BY_NAME: dict[str, ConfigKey] = {key.name: key for key in TOPIC_KEYS}

# The server's security settings (its TOML file, docs/server.md): not topic keys, but
# documented with them because they decide which topic configs a client may set.
SERVER_SECURITY_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "compaction.allowed_strategy_functions", "list", "[]",
        "The `function:MODULE:NAME` compaction strategies a Kafka client may set on a topic "
        "(CreateTopics, AlterConfigs, IncrementalAlterConfigs), as `\"MODULE:NAME\"` "
        "strings; any other is refused with INVALID_CONFIG and never imported, whether or "
        "not the authorizer is on, and the server's cleaner does not run a topic that names "
        "another.",
        allowed_text="a TOML list of \"MODULE:NAME\" strings",
    ),
    ConfigKey(
        "authorization.enabled", "boolean", False,
        "Check ACLs on every request (Kafka's authorizer). Off: every request is allowed and "
        "the ACL APIs answer SECURITY_DISABLED.",
    ),
    ConfigKey(
        "authorization.super_users", "list", "[]",
        "Principals allowed everything whatever the ACLs say, e.g. `[\"User:admin\"]`.",
        kafka_default="super.users", allowed_text="a TOML list of \"Type:name\" strings",
    ),
    ConfigKey(
        "authorization.allow_everyone_if_no_acl_found", "boolean", False,
        "A request on a resource that no ACL names (for anyone) is allowed. Kafka's "
        "`allow.everyone.if.no.acl.found`, false by default as in Kafka.",
    ),
    ConfigKey(
        "authorization.admin_tokens_file", "string", "none",
        "A file of `PRINCIPAL TOKEN` lines: the admin HTTP API's bearer tokens. Set, every "
        "admin request but the open ones needs a valid token.",
        allowed_text="a path",
    ),
    ConfigKey(
        "authorization.admin_open_health_and_metrics", "boolean", True,
        "`/metrics` and `/v1/health` answer without a principal; false: they need DESCRIBE "
        "on the cluster.",
    ),
)

# The server's compaction settings that Kafka has as broker configs (table `[compaction]`
# of its TOML file): not topic keys, as Kafka's are not.
SERVER_COMPACTION_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "compaction.io_max_bytes_per_s", "double", 0.0,
        "The bytes per second that a compaction run reads and writes, together, at most "
        "(Kafka's log.cleaner.io.max.bytes.per.second, as its Throttler counts them: the "
        "tasks' Parquet reads, checksum reads and ledger writes). Checked every 0.3 s, as "
        "Kafka's cleaner does: a task that runs ahead sleeps until the bytes of the "
        "interval fit the rate. A run's tasks run at once in separate Spark Python "
        "workers (or threads of the compacting process), so each of the N tasks running "
        "at once is held to this / N; once the shorter ones end, the run stays below the "
        "cap. The report says how long the tasks slept (`throttled_s`). The server's "
        "cleaner hands it to its compaction processes as the Spark setting "
        "`spark.compactlog.log.cleaner.io.max.bytes.per.second`, which `compactlog "
        "compact --spark-conf` also takes; runs of the Spark SQL pipeline (`function:` "
        "strategies, compaction.phase1.engine=sql) are not throttled. The next run of the "
        "cleaner also waits until the average rate since its first paced run is within "
        "the cap. 0: unlimited (Kafka's default, Double.MaxValue).",
        minimum=0.0, kafka_default="log.cleaner.io.max.bytes.per.second",
    ),
)


@dataclass(frozen=True)
class TopicConfig:
    """The effective config of one topic: defaults overlaid with the topic's own values."""

    overrides: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        if name in self.overrides:
            return self.overrides[name]
        return TOPIC_KEYS_BY_NAME[name].default

    def effective(self) -> dict[str, Any]:
        return {key.name: self[key.name] for key in TOPIC_KEYS}

    @property
    def cleanup_policy(self) -> str:
        return str(self["cleanup.policy"])

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @cached_property  # per produced batch; a TopicConfig never changes
    def log_append_time(self) -> bool:
        """message.timestamp.type=LogAppendTime: the server stamps batches at append."""
        return bool(self["message.timestamp.type"] == "LogAppendTime")

    @cached_property  # per produced batch; a TopicConfig never changes
    def timestamp_limits(self) -> tuple[int, int]:
        """How far (ms) a CreateTime record may lie before and after the server's clock:
        message.timestamp.before/after.max.ms, each falling back to the deprecated
        message.timestamp.difference.max.ms while left at Long.MAX (Kafka's LogConfig)."""
        difference = int(self["message.timestamp.difference.max.ms"])
        before = int(self["message.timestamp.before.max.ms"])
        after = int(self["message.timestamp.after.max.ms"])
        return (difference if before == LONG_MAX else before,
                difference if after == LONG_MAX else after)

    @cached_property  # per produced batch; a TopicConfig never changes
    def codec(self) -> int | None:
        """compression.type as a batch codec id, or None for `producer` (keep the batch's)."""
        name = str(self["compression.type"])
        return None if name == PRODUCER_CODEC else TOPIC_CODECS[name]

    @classmethod
    def from_strings(cls, raw: Mapping[str, object]) -> TopicConfig:
        return cls(validate_overrides(raw))

    @classmethod
    def from_stored(cls, raw: Mapping[str, object]) -> TopicConfig:
        """A topic's stored overrides, less any key retired since they were written
        (RETIRED_TOPIC_KEYS), so that a topic created by an earlier build still opens."""
        return cls.from_strings({name: value for name, value in raw.items()
                                 if name not in RETIRED_TOPIC_KEYS})

    def altered(self, set_values: Mapping[str, object], delete: Iterable[str] = ()) -> TopicConfig:
        merged = dict(self.overrides)
        for name in delete:
            lookup(name)
            merged.pop(name, None)
        merged.update(validate_overrides(set_values))
        return TopicConfig(merged)


# Topic configs that earlier builds accepted and this one does not: what replaced each.
# A topic stored with one still opens (TopicConfig.from_stored drops it); setting one
# anew is refused with this reason.
RETIRED_TOPIC_KEYS: dict[str, str] = {
    "compaction.inline.max.bytes":
        "every compaction is a Spark job now; to run one without Spark, set "
        "compaction.without.spark=true",
}


def lookup(name: str) -> ConfigKey:
    key = TOPIC_KEYS_BY_NAME.get(name)
    if key is None:
        if name in RETIRED_TOPIC_KEYS:
            raise RetiredConfigError(name, RETIRED_TOPIC_KEYS[name])
        raise UnknownConfigError(name, list(TOPIC_KEYS_BY_NAME))
    return key


def validate_overrides(raw: Mapping[str, object]) -> dict[str, Any]:
    return {name: lookup(name).parse(value) for name, value in raw.items()}


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """Parse `KEY=VALUE` strings, as given to `--config`."""
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"expected KEY=VALUE, got {item!r}")
        result[name.strip()] = value.strip()
    return result
