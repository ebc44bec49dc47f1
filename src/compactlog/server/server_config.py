"""The server's settings: one dataclass, filled from the TOML file (cli/serve.py) with
Kafka's names and defaults where Kafka has them.

Invariant: a ServerConfig the server starts with has passed `check`, which names the
first setting out of its range in one line, before anything is opened or bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compactlog.errors import UserError
from compactlog.server.broker import FETCH_MAX_BYTES
from compactlog.server.cleaner import CleanerConfig
from compactlog.server.coordinator.group_model import (
    MAX_GROUPS,
    MAX_SESSION_TIMEOUT_S,
    MIN_SESSION_TIMEOUT_S,
)
from compactlog.server.network.listeners import Listener, check_all
from compactlog.server.security.authorizer import AuthorizationConfig
from compactlog.server.security.code_allowlist import check_allow_list
from compactlog.server.security.tls import TlsSettings
from compactlog.storage import MAX_UNCOMPRESSED_BATCH_BYTES

MIB = 1 << 20


@dataclass
class ServerConfig:
    data_dir: Path  # local: the store's directory, or an S3 store's local directory
    host: str = "127.0.0.1"
    port: int = 9092
    # Resource limits (docs/server.md, "Resource limits"). Kafka's max.connections
    # (default: unlimited) and max.connections.per.ip; max_connections is also capped by
    # the open-file limit at start.
    max_connections: int = 4096
    max_connections_per_ip: int = 1024
    # Sealed-segment and ledger files held open at once (storage/filecache.py); capped
    # to a quarter of the open-file limit at start.
    max_open_data_files: int = 128
    # Kafka's connections.max.idle.ms (10 minutes).
    connections_max_idle_s: float = 600.0
    # Kafka's socket.request.max.bytes default (100 MiB).
    max_request_bytes: int = 100 * MIB
    # Kafka's queued.max.request.bytes: request bytes received and not yet answered,
    # over all connections; past it the server stops reading from sockets.
    queued_max_request_bytes: int = 256 * MIB
    # Before SASL authentication frames never count against queued_max_request_bytes:
    # those over 64 KiB count against this, per SASL listener (network/connections.py).
    queued_max_unauthenticated_bytes: int = 8 * MIB
    # The most a producer's compressed batch may decompress to: it is decompressed no
    # further, and refused with MESSAGE_TOO_LARGE (storage/inflate.py).
    max_uncompressed_batch_bytes: int = MAX_UNCOMPRESSED_BATCH_BYTES
    # Kafka's broker fetch.max.bytes: the most records one Fetch response holds,
    # whatever the request's max_bytes.
    fetch_max_bytes: int = FETCH_MAX_BYTES
    # How often the broker flushes by flush.ms, rolls and seals by segment.ms and
    # applies retention, and picks up manifests committed by other processes.
    upkeep_interval_s: float = 1.0
    # Kafka's group.initial.rebalance.delay.ms: a new group waits this long for more
    # members before its first generation.
    group_initial_rebalance_delay_s: float = 3.0
    # Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms: a JoinGroup
    # with a session timeout outside them gets INVALID_SESSION_TIMEOUT.
    group_min_session_timeout_s: float = MIN_SESSION_TIMEOUT_S
    group_max_session_timeout_s: float = MAX_SESSION_TIMEOUT_S
    # Groups held at once, and member ids handed out and not yet used: past either a
    # request that would make one more gets COORDINATOR_NOT_AVAILABLE.
    max_groups: int = MAX_GROUPS
    # On SIGTERM, how long requests in flight (a long-polling Fetch, an fsync) may take
    # to be answered before their connections are closed anyway.
    shutdown_grace_s: float = 5.0
    # The admin and metrics HTTP listener; None: none.
    admin_host: str | None = None
    admin_port: int = 9093
    # Kafka's `listeners` (server/network/listeners.py); empty: one PLAINTEXT listener on
    # host:port, as before listeners existed.
    listeners: list[Listener] = field(default_factory=list)
    # The certificate of SSL and SASL_SSL listeners (server/security/tls.py); None: no TLS.
    tls: TlsSettings | None = None
    # The store's s3:// URL, when data_dir is its local directory (storage/store.py).
    data_location: str | None = None
    # On an object store: the writer lease's time to live (backend/lease.py); a second
    # server on the same URL waits for it, and takes over once it expires.
    lease_ttl_s: float = 30.0
    # On an object store: answer acks=all (-1) produces only once their records are in
    # the bucket (server/uploads.py); false answers them from the local disk, as acks=1
    # always is (a fail-over then loses what was not uploaded yet). Every partition's
    # new records are uploaded every upload_interval_s: consumers are served only what
    # the bucket holds (the durable high watermark).
    ack_after_upload: bool = True
    upload_interval_s: float = 0.25
    # Serve the admin API over HTTPS with `tls`.
    admin_tls: bool = False
    # A failed SASL authentication from an address that failed before is answered after
    # this delay, doubling per failure up to sasl_failure_delay_max_s (Kafka's
    # connection.failed.authentication.delay.ms, made progressive).
    sasl_failure_delay_s: float = 0.1
    sasl_failure_delay_max_s: float = 5.0
    # Automatic compaction (server/cleaner.py).
    compaction: CleanerConfig = field(default_factory=CleanerConfig)
    # ACLs and the admin API's tokens (server/security/authorizer.py); off by default.
    authorization: AuthorizationConfig = field(default_factory=AuthorizationConfig)

    def check(self) -> None:
        """Raise UserError naming the first setting out of its range."""
        for name in ("max_connections", "max_connections_per_ip", "max_open_data_files",
                     "max_request_bytes", "queued_max_request_bytes",
                     "queued_max_unauthenticated_bytes", "max_uncompressed_batch_bytes",
                     "fetch_max_bytes", "max_groups"):
            value = getattr(self, name)
            if value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")
        for name in ("connections_max_idle_s", "upkeep_interval_s", "lease_ttl_s",
                     "upload_interval_s"):
            value = getattr(self, name)
            if value <= 0:
                raise UserError(f"{name} must be above 0, got {value}")
        for name in ("group_initial_rebalance_delay_s", "shutdown_grace_s",
                     "group_min_session_timeout_s"):
            value = getattr(self, name)
            if value < 0:
                raise UserError(f"{name} must be 0 or above, got {value}")
        if self.group_max_session_timeout_s < self.group_min_session_timeout_s:
            raise UserError(
                f"group_max_session_timeout_s ({self.group_max_session_timeout_s}) must be "
                f"at least group_min_session_timeout_s ({self.group_min_session_timeout_s})")
        try:
            self.authorization.check()
            check_allow_list(self.compaction.allowed_strategy_functions)
        except ValueError as error:
            raise UserError(str(error)) from None
        for name in ("sasl_failure_delay_s", "sasl_failure_delay_max_s"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must be 0 or above, got {getattr(self, name)}")
        if self.tls is not None:
            self.tls.check()
        if self.admin_tls and self.tls is None:
            raise UserError("admin_tls needs the [tls] settings (cert_file, key_file)")
        check_all(self.kafka_listeners(), self.tls is not None)
        if self.queued_max_request_bytes < self.max_request_bytes:
            # Else the largest request allowed could never be read.
            raise UserError(
                f"queued_max_request_bytes ({self.queued_max_request_bytes}) must be at "
                f"least max_request_bytes ({self.max_request_bytes})")

    def kafka_listeners(self) -> list[Listener]:
        return self.listeners or [Listener("PLAINTEXT", "PLAINTEXT", self.host, self.port)]
