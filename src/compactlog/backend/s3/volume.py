"""A partition's durable files under an S3 prefix (ObjectVolume), with a local read cache.

Invariant (the Volume invariant of compactlog.backend, on S3): a data file is published
whole under a name that is never reused, and is never overwritten: by a PUT with
`If-None-Match: *`, so a second PUT of a taken name fails instead of replacing it. A
reader gets a local path it can open (`fetch`): a copy downloaded whole into a local
read cache, under a temporary name renamed into place, so a cached copy is never
partial. The readers' checks (size and CRC32C against the manifest,
sealed.verify_file) run on that copy, so a damaged object is caught as a damaged file
is. Names are never reused, so a cached copy never goes stale; the cache only needs
eviction, not invalidation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from compactlog import faults, fsutil
from compactlog.backend import Document, Listed, Location
from compactlog.backend.s3.bucket import Bucket
from compactlog.backend.s3.error_mapping import ObjectStoreSetupError
from compactlog.backend.s3.settings import S3Settings
from compactlog.bounded_cache import BoundedCache
from compactlog.errors import StorageError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# Bytes of downloaded copies a process keeps in its read cache before evicting the
# least recently used (`storage.cache.max.bytes` in the server's config).
DEFAULT_CACHE_BYTES = 2 * 1024**3
# A download whose body is cut short is read again, up to this many times in all.
READ_ATTEMPTS = 3


class ReadCache:
    """Downloaded copies of immutable objects, evicted least recently used past
    `max_bytes`. An evicted copy that a reader still has open stays readable (POSIX)."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._sizes: BoundedCache[Path, int] = BoundedCache(
            max_weight=max_bytes, weigh=lambda size: size,
            on_evict=lambda path, _size: path.unlink(missing_ok=True))

    def touch(self, path: Path) -> None:
        self._sizes.get(path)

    def add(self, path: Path, size: int) -> None:
        self._sizes.put(path, size)

    def forget(self, path: Path) -> None:
        self._sizes.pop(path)
        path.unlink(missing_ok=True)


_CACHES: dict[Path, ReadCache] = {}
_CACHES_LOCK = threading.Lock()


def read_cache(root: Path) -> ReadCache:
    """The process' one cache for `root` (so every volume under it shares the budget)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(root)
        if cache is None:
            cache = _CACHES[root] = ReadCache(root)
        return cache


_CLIENTS: dict[tuple[str | None, str | None, str | None], S3Client] = {}


def s3_client(env: Mapping[str, str] | None = None) -> S3Client:
    """One boto3 client per endpoint, region and access key in a process (clients are
    thread-safe and hold a connection pool; making one per volume would not reuse it)."""
    settings = S3Settings.from_env(env)
    key = (settings.endpoint_url, settings.region, settings.access_key_id)
    with _CACHES_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = settings.boto3_client()
        return client


class ObjectVolume:
    """A partition's durable files under an S3 prefix, with a local read cache."""

    def __init__(self, location: Location, cache_dir: Path, client: S3Client | None = None,
                 cache: ReadCache | None = None) -> None:
        if location.bucket is None:
            raise ValueError(f"{location} is not an s3:// location")
        self.location = location
        self.bucket: str = location.bucket
        self.cache_dir = cache_dir
        self.objects = Bucket(client if client is not None else s3_client(), self.bucket)
        self.cache = cache if cache is not None else read_cache(cache_dir)

    @property
    def client(self) -> S3Client:
        return self.objects.client

    @property
    def spec(self) -> dict[str, str]:
        return {"kind": "s3", "url": str(self.location)}

    @property
    def is_local(self) -> bool:
        return False

    def key(self, relative: str) -> str:
        return self.location.key(relative)

    def describe(self, relative: str) -> str:
        return f"s3://{self.bucket}/{self.key(relative)}"

    def url(self, relative: str) -> str:
        return f"s3://{self.bucket}/{self.key(relative)}"

    def document(self, name: str) -> Document:
        from compactlog.backend.s3.document import ObjectDocument

        return ObjectDocument(self.client, self.bucket, self.key(name))

    def path_of(self, relative: str) -> Path:
        return self.cache_dir / self.key(relative)

    def fetch(self, relative: str) -> Path:
        path = self.path_of(relative)
        if path.exists():
            self.cache.touch(path)
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = fsutil.temp_path(path.parent, path.name)
        try:
            faults.point("download", path)
            size = self._download(relative, temp)
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)
        self.cache.add(path, size)
        return path

    def _download(self, relative: str, temp: Path) -> int:
        """GET `relative` into `temp`; its size. The client retries the request; a body
        cut short or stalled while it is read is downloaded again (READ_ATTEMPTS)."""
        size = self.objects.download(self.key(relative), temp, body_attempts=READ_ATTEMPTS)
        if size is None:
            raise FileNotFoundError(self.describe(relative))
        return size

    def publish(self, temp: Path, relative: str) -> None:
        """Create-only PUT (Bucket.create: a lost answer whose retry meets this PUT's
        own object is told from a name someone else took)."""
        try:
            faults.point("upload", temp)
            with open(temp, "rb") as body:
                created = self.objects.create(self.key(relative), body)
        except (StorageError, ObjectStoreSetupError):
            temp.unlink(missing_ok=True)
            raise
        except OSError as error:  # the local file, or a fault point, as a failed PUT
            temp.unlink(missing_ok=True)
            raise self.objects.failed("PUT", self.key(relative), error) from error
        if not created:
            temp.unlink(missing_ok=True)
            raise StorageError(f"{self.describe(relative)}: the name is taken; a data file "
                               "is never replaced")
        self._keep_as_cached(temp, relative)

    def publish_copy(self, temp: Path, relative: str, source: str) -> None:
        """CopyObject from `source` (Bucket.copy: unconditional, so only under a name no
        other writer uses for other bytes, as the caller promises)."""
        try:
            faults.point("upload", temp)
            self.objects.copy(self.key(source), self.key(relative))
        except (StorageError, ObjectStoreSetupError):
            temp.unlink(missing_ok=True)
            raise
        except OSError as error:  # a fault point, as a failed request
            temp.unlink(missing_ok=True)
            raise self.objects.failed("COPY", self.key(relative), error) from error
        self._keep_as_cached(temp, relative)

    def _keep_as_cached(self, temp: Path, relative: str) -> None:
        # The object's bytes are the local file's: keep it as the cached copy.
        path = self.path_of(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = temp.stat().st_size
        os.replace(temp, path)
        self.cache.add(path, size)

    def remove(self, relative: str) -> bool:
        faults.point("unlink", self.path_of(relative))
        self.cache.forget(self.path_of(relative))
        self.objects.delete(self.key(relative))
        return True

    def evict(self, relative: str) -> None:
        self.cache.forget(self.path_of(relative))

    def settle(self, folder: str) -> None:
        """Nothing to do: an object store's DELETE is durable when it answers."""

    def listing(self, folder: str) -> list[Listed]:
        start = self.key(folder) + "/"
        return [Listed(entry.key[len(start):], entry.modified_ms)
                for entry in self.objects.list(start, delimiter=True)]


def remove_prefix(location: Location, client: S3Client | None = None) -> int:
    """Delete every object under an s3:// prefix (a deleted topic's partitions); the
    number deleted."""
    assert location.bucket is not None
    bucket = Bucket(client if client is not None else s3_client(), location.bucket)
    return bucket.delete_all(location.path + "/" if location.path else "", str(location))


_TASK_CACHE: list[Path] = []


def task_cache_dir() -> Path:
    """A read cache directory of this process's own (a Spark task's), made once."""
    import tempfile

    with _CACHES_LOCK:
        if not _TASK_CACHE:
            _TASK_CACHE.append(Path(tempfile.mkdtemp(prefix="compactlog-cache-")))
        return _TASK_CACHE[0]

