"""The server's Prometheus metrics, served at the admin listener's /metrics.

Counters are bumped where the events happen (produce, fetch, a finished compaction).
Figures that are state rather than events (dirty ratio, consumer-group lag, uncleanable
partitions, time since the cleaner last ran) are read from the store, the group
coordinator and the cleaner when Prometheus scrapes, so they are never stale. Each server
has its own registry: two servers in one process (the tests) do not share figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from compactlog.errors import CompactlogError
from compactlog.server.protocol.record_batches import view_start_offset

if TYPE_CHECKING:
    from compactlog.server.cleaner import Cleaner
    from compactlog.server.coordinator.group_coordinator import GroupCoordinator
    from compactlog.storage import LogStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.records_in = Counter("compactlog_topic_records_in", "Records appended by produce "
                                  "requests.", ["topic"], registry=r)
        self.bytes_in = Counter("compactlog_topic_bytes_in", "Record-batch bytes appended by "
                                "produce requests.", ["topic"], registry=r)
        self.records_out = Counter("compactlog_topic_records_out", "Records sent in fetch "
                                   "responses.", ["topic"], registry=r)
        self.bytes_out = Counter("compactlog_topic_bytes_out", "Record-batch bytes sent in "
                                 "fetch responses.", ["topic"], registry=r)
        self.requests = Counter("compactlog_server_requests", "Requests read and handled, by "
                                "API.", ["api"], registry=r)
        self.connections_refused = Counter(
            "compactlog_server_connections_refused", "Connections closed as soon as accepted, "
            "by the limit they were over: total (max_connections) or per_ip "
            "(max_connections_per_ip).", ["reason"], registry=r)
        for reason in ("total", "per_ip"):
            self.connections_refused.labels(reason)
        self.sasl_authentications = Counter(
            "compactlog_server_sasl_authentications", "SASL exchanges that ended, by "
            "mechanism and result (success, failure).", ["mechanism", "result"], registry=r)
        self.tls_handshakes_failed = Counter(
            "compactlog_server_tls_handshakes_failed", "TLS handshakes on the Kafka "
            "listeners that failed (an untrusted, expired or missing client certificate, a "
            "protocol below TLS 1.2, a client that went away).", registry=r)
        self.connections_closed_idle = Counter(
            "compactlog_server_connections_closed_idle", "Connections closed because their "
            "client sent nothing, or took none of a response, for connections_max_idle_s.",
            registry=r)
        self.compaction_runs = Counter(
            "compactlog_compaction_runs", "Compaction runs finished, by result (success, "
            "error) and by what started them (scheduler, request).",
            ["topic", "result", "trigger"], registry=r)
        self.compaction_duration = Histogram(
            "compactlog_compaction_duration_seconds", "Wall time of compaction runs, Spark "
            "start-up included.", ["topic"], buckets=DURATION_BUCKETS, registry=r)
        self.compaction_records_in = Counter(
            "compactlog_compaction_records_in", "Records read by successful compaction runs "
            "(previous ledger plus new segments).", ["topic"], registry=r)
        self.compaction_records_out = Counter(
            "compactlog_compaction_records_out", "Records written to ledgers by successful "
            "compaction runs.", ["topic"], registry=r)
        self.compaction_records_removed = Counter(
            "compactlog_compaction_records_removed", "Records dropped by successful "
            "compaction runs (records in minus records out).", ["topic"], registry=r)
        self.compaction_bytes_in = Counter(
            "compactlog_compaction_bytes_in", "Bytes read by successful compaction runs.",
            ["topic"], registry=r)
        self.compaction_io_bytes = Counter(
            "compactlog_compaction_io_bytes", "Bytes the compaction tasks of successful "
            "runs read (Parquet column chunks, checksum reads) and wrote (ledger files): "
            "what io_max_bytes_per_s (log.cleaner.io.max.bytes.per.second) caps.",
            ["topic", "direction"], registry=r)
        self.compaction_throttled = Counter(
            "compactlog_compaction_throttled_seconds", "Seconds the compaction tasks of "
            "successful runs slept to stay under io_max_bytes_per_s, summed over tasks.",
            ["topic"], registry=r)

    def watch(self, collector: Collector) -> None:
        self.registry.register(collector)

    def render(self, visible: Visible | None = None) -> bytes:
        """The text format; with `visible`, only the samples whose topic and group
        labels it allows (and every sample without such labels)."""
        if visible is None:
            return generate_latest(self.registry)
        return generate_latest(_Filtered(self.registry, visible))


# Whether a sample labelled with this resource may be shown: ("topic" | "group", name).
Visible = Callable[[str, str], bool]
_RESOURCE_LABELS = ("topic", "group")


class _Filtered:
    """A registry's families with the samples `visible` refuses left out."""

    def __init__(self, registry: CollectorRegistry, visible: Visible) -> None:
        self.registry = registry
        self.visible = visible
        self._decided: dict[tuple[str, str], bool] = {}

    def _shows(self, labels: dict[str, str]) -> bool:
        for label in _RESOURCE_LABELS:
            name = labels.get(label)
            if name is None:
                continue
            key = (label, name)
            if key not in self._decided:
                self._decided[key] = self.visible(label, name)
            if not self._decided[key]:
                return False
        return True

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [sample for sample in family.samples if self._shows(sample.labels)]
            if len(samples) == len(family.samples):
                yield family
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = samples
            yield kept


class ConnectionState(Protocol):
    """What the connection handler tells the metrics (server/network/connections.py)."""

    @property
    def open_count(self) -> int: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def bytes_in_flight(self) -> int: ...
    @property
    def paused_s(self) -> float: ...


class ConnectionCollector(Collector):
    """Connection and request-memory figures, read at scrape time."""

    def __init__(self, state: ConnectionState) -> None:
        self.state = state

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self.state
        yield GaugeMetricFamily("compactlog_server_connections",
                                "Client connections open on the Kafka listener.",
                                value=state.open_count)
        yield GaugeMetricFamily("compactlog_server_max_connections",
                                "The connection limit in force: max_connections, capped by "
                                "the open-file limit.", value=state.max_connections)
        yield GaugeMetricFamily("compactlog_server_request_bytes_in_flight",
                                "Request bytes received and not yet answered, counted "
                                "against queued_max_request_bytes.",
                                value=state.bytes_in_flight)
        yield CounterMetricFamily("compactlog_server_read_paused_seconds",
                                  "Seconds during which connections stopped reading from "
                                  "their sockets because the request memory budget "
                                  "(queued_max_request_bytes) was spent.",
                                  value=state.paused_s)


class StateCollector(Collector):
    """Gauges read at scrape time from the store, the groups and the cleaner."""

    def __init__(self, store: LogStore, groups: GroupCoordinator, cleaner: Cleaner | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.groups = groups
        self.cleaner = cleaner
        self.clock = clock
        self.started = clock()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # the families depend on the topics; none is fixed up front

    def collect(self) -> Iterator[GaugeMetricFamily]:
        end = GaugeMetricFamily("compactlog_partition_log_end_offset",
                                "The offset the next record appended will get.",
                                labels=["topic", "partition"])
        start = GaugeMetricFamily("compactlog_partition_log_start_offset",
                                  "The first offset readable (the compacted view's, for "
                                  "compacted topics).", labels=["topic", "partition"])
        dirty = GaugeMetricFamily("compactlog_compaction_dirty_ratio",
                                  "Sealed bytes above the horizon over ledger plus those "
                                  "bytes (Kafka's dirty ratio).", labels=["topic", "partition"])
        dirty_bytes = GaugeMetricFamily("compactlog_compaction_dirty_bytes",
                                        "Sealed bytes above the compaction horizon.",
                                        labels=["topic", "partition"])
        ledger_files = GaugeMetricFamily("compactlog_compaction_ledger_files",
                                         "Files in the partition's ledger (small ones merge: "
                                         "compaction.ledger.merge.below.bytes).",
                                         labels=["topic", "partition"])
        ends: dict[tuple[str, int], int] = {}
        for name in self.store.list_topics():
            try:
                topic = self.store.topic(name)
            except (OSError, CompactlogError):
                continue  # cannot be opened (upkeep logs why): the others are shown
            for partition in topic.partitions:
                labels = [name, str(partition.index)]
                stats = partition.stats()
                ends[(name, partition.index)] = stats["log_end_offset"]
                end.add_metric(labels, stats["log_end_offset"])
                start.add_metric(labels, view_start_offset(partition, topic.config.compacted))
                if topic.config.compacted:
                    dirty.add_metric(labels, stats["dirty_ratio"])
                    dirty_bytes.add_metric(labels, stats["dirty_bytes"])
                    ledger_files.add_metric(labels, stats["ledger_files"])
        yield from (end, start, dirty, dirty_bytes, ledger_files)
        yield self._lag(ends)
        if self.cleaner is not None:
            yield from self._cleaner()

    def _lag(self, ends: dict[tuple[str, int], int]) -> GaugeMetricFamily:
        lag = GaugeMetricFamily("compactlog_consumer_group_lag",
                                "Log end offset minus the group's committed offset.",
                                labels=["group", "topic", "partition"])
        for group_id, group in list(self.groups.groups.items()):
            for (topic, index), committed in list(group.offsets.items()):
                log_end = ends.get((topic, index))
                if log_end is not None and committed.offset >= 0:
                    lag.add_metric([group_id, topic, str(index)],
                                   max(log_end - committed.offset, 0))
        return lag

    def _cleaner(self) -> Iterator[GaugeMetricFamily]:
        cleaner = self.cleaner
        assert cleaner is not None
        failures = cleaner.scheduler.uncleanable()
        flagged = GaugeMetricFamily("compactlog_compaction_partition_uncleanable",
                                    "1 while the partition's last compaction failed and it "
                                    "waits out its backoff.", labels=["topic", "partition"])
        for (topic, index) in failures:
            flagged.add_metric([topic, str(index)], 1)
        yield flagged
        yield GaugeMetricFamily("compactlog_compaction_uncleanable_partitions",
                                "Partitions whose last compaction failed.", value=len(failures))
        yield GaugeMetricFamily("compactlog_compaction_running",
                                "Compaction runs in progress.",
                                value=len(cleaner.scheduler.state.running))
        last = cleaner.scheduler.state.last_finished_s
        since = self.clock() - (self.started if last is None else last)
        yield GaugeMetricFamily("compactlog_compaction_seconds_since_last_run",
                                "Seconds since a compaction run last finished (since the "
                                "server started, if none has).", value=since)
        checked = cleaner.last_check_s
        yield GaugeMetricFamily("compactlog_compaction_seconds_since_last_check",
                                "Seconds since the cleaner last looked for due partitions: "
                                "growing past its check interval means it has stopped.",
                                value=self.clock() - (self.started if checked is None
                                                      else checked))
        yield GaugeMetricFamily("compactlog_compaction_cleaner_enabled",
                                "1 if the server compacts on its own.",
                                value=1 if cleaner.config.enabled else 0)
