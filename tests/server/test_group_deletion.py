"""The group coordinator's deletions (DeleteGroups, OffsetDelete), in process: they are
durable, ordered after the commits before them, and a failed write leaves the group as
it was."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from compactlog import faults
from compactlog.server.coordinator.group_coordinator import GroupCoordinator
from compactlog.server.coordinator.group_model import (
    Group,
    GroupError,
    Member,
    subscribed_topics,
)
from support.admin_wire import consumer_subscription


def fail_at(kind: str) -> faults.Injector:
    def inject(point: str, path: str) -> None:
        if point == kind and "/groups/" in path:
            raise OSError(errno.EIO, "injected", path)
    return inject


def test_a_deletion_is_never_overtaken_by_an_earlier_commit(tmp_path: Path) -> None:
    def slow_writes(point: str, path: str) -> None:
        if point == "write" and "/groups/" in path:
            time.sleep(0.2)  # the commit's write is still going when the delete comes

    async def run() -> None:
        coordinator = GroupCoordinator(tmp_path)
        try:
            with faults.injected(slow_writes):
                committing = asyncio.create_task(
                    coordinator.commit("g", "", -1, {("t", 0): (5, -1, None)}))
                await asyncio.sleep(0.05)  # the commit has queued its write
                assert await coordinator.delete_groups(["g"]) == [ErrorCode.none]
                await committing
        finally:
            coordinator.close()

    asyncio.run(run())
    assert not list((tmp_path / "groups").iterdir())
    assert GroupCoordinator(tmp_path).groups == {}


def test_a_failed_deletion_leaves_the_group_as_it_was(tmp_path: Path) -> None:
    async def run() -> None:
        coordinator = GroupCoordinator(tmp_path)
        try:
            await coordinator.commit("g", "", -1, {("t", 0): (5, -1, None),
                                                   ("u", 0): (6, -1, None)})
            with faults.injected(fail_at("unlink")):
                assert await coordinator.delete_groups(["g", "nope"]) == [
                    ErrorCode.coordinator_not_available, ErrorCode.group_id_not_found]
            assert set(coordinator.fetch_offsets("g")) == {("t", 0), ("u", 0)}
            group = coordinator.offsets_deletable("g")
            with faults.injected(fail_at("write")), pytest.raises(GroupError) as failed:
                await coordinator.delete_offsets(group, [("t", 0)])
            assert failed.value.code is ErrorCode.coordinator_not_available
            assert set(coordinator.fetch_offsets("g")) == {("t", 0), ("u", 0)}
            await coordinator.delete_offsets(group, [("t", 0)])
        finally:
            coordinator.close()

    asyncio.run(run())
    assert set(GroupCoordinator(tmp_path).fetch_offsets("g")) == {("u", 0)}


def member(metadata: bytes) -> Member:
    return Member("m", None, "c", "127.0.0.1", 10.0, 10.0, "consumer",
                  [("range", metadata)])


@pytest.mark.parametrize(("metadata", "expected"), [
    (consumer_subscription("a", "b"), {"a", "b"}),
    (consumer_subscription(), set()),
    (consumer_subscription("a")[:7], None),  # cut inside the topic's name
    (b"\x00", None),
])
def test_subscribed_topics_are_read_from_the_consumer_protocol(
        metadata: bytes, expected: set[str] | None) -> None:
    group = Group("g", protocol_type="consumer", protocol_name="range",
                  members={"m": member(metadata)})
    assert subscribed_topics(group) == expected
    assert subscribed_topics(Group("g", protocol_type="connect", protocol_name="range",
                                   members={"m": member(metadata)})) is None
