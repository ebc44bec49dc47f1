"""The broker: what the protocol handlers share, and the handler table.

One broker owns the data directory as its single writer. Store calls block (file I/O,
fsync, Parquet), so they run on a small thread pool and never on the event loop;
appends to one partition are serialized by the partition's own lock. Fetches that
find nothing wait on `data_arrived`, which every append sets, so long-polls answer as
soon as data comes instead of spinning.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from compactlog.backend import Document, load_or_create
from compactlog.log_throttle import Throttle
from compactlog.server.coordinator.group_coordinator import GroupCoordinator
from compactlog.server.coordinator.group_model import (
    MAX_GROUPS,
    MAX_SESSION_TIMEOUT_S,
    MIN_SESSION_TIMEOUT_S,
)
from compactlog.server.coordinator.offset_files import offset_files_of
from compactlog.server.metrics import ServerMetrics
from compactlog.server.network import listeners
from compactlog.server.producer_ids import ID_DOCUMENT, DocumentIdAllocator
from compactlog.server.producers import ProducerStates
from compactlog.server.protocol.messages import Request
from compactlog.server.security.authorizer import ACL_DIR, AuthorizationConfig, Authorizer
from compactlog.server.security.credentials import DIRECTORY as CREDENTIALS_DIR
from compactlog.server.security.credentials import CredentialStore
from compactlog.server.security.sasl_users import SaslUsers
from compactlog.server.uploads import Uploads
from compactlog.storage import LogStore

log = logging.getLogger("compactlog.server")
T = TypeVar("T")
CLUSTER_DOCUMENT = "cluster"  # on an object store, under the data location
FETCH_MAX_BYTES = 55 << 20  # Kafka's broker fetch.max.bytes default

# A handler answers a request with a version-neutral response dict, or None for "send
# nothing" (Produce with acks=0).
Handler = Callable[["Broker", Request], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler
    advertised_min: int  # what ApiVersions lists; below min_version is still refused


class Broker:
    node_id = 0

    def __init__(self, store: LogStore, host: str, port: int, io_threads: int = 4,
                 initial_rebalance_delay_s: float = 3.0,
                 authorization: AuthorizationConfig | None = None,
                 allowed_functions: frozenset[str] = frozenset(),
                 fetch_max_bytes: int = FETCH_MAX_BYTES,
                 sasl_users: SaslUsers | None = None,
                 session_timeout_bounds_s: tuple[float, float] = (
                     MIN_SESSION_TIMEOUT_S, MAX_SESSION_TIMEOUT_S),
                 max_groups: int = MAX_GROUPS) -> None:
        self.store = store
        # The most records a Fetch response holds (the first batch always goes whole).
        self.fetch_max_bytes = fetch_max_bytes
        # The broker's own state lives with the topics (on S3, where a server that
        # takes over finds it): compactlog.backend `state_document`.
        state = store.layout.state_document
        # ACLs (server/security/authorizer.py); off unless the config turns it on.
        self.authorizer = Authorizer(state(ACL_DIR), authorization or AuthorizationConfig())
        # `function:` compaction strategies a client may name (server/security/code_allowlist.py).
        self.allowed_functions = allowed_functions
        self.groups = GroupCoordinator(
            offset_files_of(store.location, store.data_dir, store.lease),
            initial_rebalance_delay_s, *session_timeout_bounds_s, max_groups)
        # Idempotent producers: ids, and each partition's sequence state (producers.py).
        self.producers = ProducerStates(
            DocumentIdAllocator(state(ID_DOCUMENT)) if store.location.is_s3
            else store.data_dir)
        # The address advertised when no listener is in context (tests that call
        # handlers directly); a request's own listener's otherwise (`host`, `port`).
        self.default_host = host
        self.default_port = port
        # SASL/SCRAM credentials (server/security/credentials.py), and the logins' copy of them in
        # memory (server/security/sasl_users.py), which a change made here updates at once.
        self.sasl_users = sasl_users
        self.credentials = (sasl_users.store if sasl_users is not None
                            else CredentialStore(state(CREDENTIALS_DIR)))
        self.cluster_id = (_shared_cluster_id(state(CLUSTER_DOCUMENT)) if store.location.is_s3
                           else _cluster_id(store.data_dir))
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="compactlog-io")
        self.data_arrived = asyncio.Event()
        self.apis: dict[int, Api] = {}
        self.metrics = ServerMetrics()  # the server hands in the one it serves
        # Failures that clients retry fast (a fetch of a damaged partition) are logged
        # once per partition per minute.
        self.failure_log = Throttle(60.0)
        # ack_after_upload (server/uploads.py): None unless the server turns it on.
        self.uploads: Uploads | None = None

    @property
    def host(self) -> str:
        """The host advertised to the client of the request being handled: its
        listener's (Kafka advertises the listener a request came in on)."""
        listener = listeners.current.get()
        return self.default_host if listener is None else listener.advertised[0]

    @property
    def port(self) -> int:
        listener = listeners.current.get()
        return self.default_port if listener is None else listener.advertised[1]

    def register(self, key: int, versions: tuple[int, int], handler: Handler,
                 advertised_min: int | None = None) -> None:
        low = versions[0] if advertised_min is None else advertised_min
        self.apis[key] = Api(key, versions[0], versions[1], handler, low)

    @property
    def versions(self) -> dict[int, tuple[int, int]]:
        """The versions served, by API key."""
        return {key: (api.min_version, api.max_version) for key, api in self.apis.items()}

    @property
    def advertised(self) -> dict[int, tuple[int, int]]:
        """The versions ApiVersions lists, by API key."""
        return {key: (api.advertised_min, api.max_version) for key, api in self.apis.items()}

    async def run_io(self, call: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call off the event loop, in the caller's context (the
        request's listener among it)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            self._io, context.run, call, *args)

    def notify_data(self) -> None:
        """Wake every waiting fetch; each re-checks its own partitions."""
        self.data_arrived.set()
        self.data_arrived = asyncio.Event()

    def close(self) -> None:
        self._io.shutdown(wait=True)
        self.groups.close()


def _new_cluster_id() -> str:
    # Kafka's cluster ids are URL-safe base64 of a UUID, 22 characters.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _shared_cluster_id(document: Document) -> str:
    """The cluster id of a store on S3, the same for every server that owns it in turn:
    the first commits it, the others read it."""
    return str(load_or_create(document, lambda: {"cluster_id": _new_cluster_id()})
               .body["cluster_id"])


def _cluster_id(data_dir: Path) -> str:
    """A stable cluster id per data directory (clients log it and some compare it)."""
    path = data_dir / "cluster.id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = _new_cluster_id()
        temp = path.with_suffix(".tmp")
        temp.write_text(value + "\n")
        temp.replace(path)
        return value
