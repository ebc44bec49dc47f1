"""The group coordinator: Kafka's classic consumer-group protocol, and committed offsets.

One broker is the coordinator of every group. A group moves through Kafka's states:

    Empty -> PreparingRebalance -> CompletingRebalance -> Stable -> PreparingRebalance ...

A member's session timeout must lie within [min_session_timeout_s,
max_session_timeout_s] (Kafka's group.min.session.timeout.ms and
group.max.session.timeout.ms, 6 s and 30 min): a JoinGroup outside them is refused
with INVALID_SESSION_TIMEOUT, as Kafka refuses it, so that a member that goes away
holds its group for at most the maximum, not the 24.8 days of 2**31-1 ms.

A JoinGroup with an empty member id (KIP-394's first step) hands out a pending member
id, which expires after the member's session timeout unless the member comes back with
it, as Kafka's pending members do; a LeaveGroup naming it forgets it at once. A group
left Empty, with no member, no pending id and no committed offsets, is removed at the
next upkeep round, as Kafka removes it (Dead) at its next cleanup: a client that joins
80,000 made-up groups and goes away leaves nothing behind. Kafka's cleanup runs every
offsets.retention.check.interval.ms (10 min), the upkeep every second, so a group whose
last member leaves without committing is gone from ListGroups within a second. At most
`max_groups` groups are held, and at most as many pending member ids: a request that
would make one more gets COORDINATOR_NOT_AVAILABLE (retriable: groups expire), with a
log line naming the setting.

A rebalance starts when a member joins, leaves or misses its session timeout. The
coordinator then waits for every known member to send JoinGroup again (up to the
largest rebalance timeout; members that do not come are removed), and for a new group
also `initial_rebalance_delay_s` so that members starting together land in one
generation (Kafka's group.initial.rebalance.delay.ms). It answers all joins at once:
the leader gets every member's subscription, computes the assignment client-side and
hands it back in SyncGroup, which the coordinator passes to each member.

Static members (KIP-345, server/coordinator/static_members.py) join with a group
instance id. One that comes back with an empty member id and an instance id the group
knows replaces its old member id by a new one, keeping its assignment; the old id is
fenced (FENCED_INSTANCE_ID on its JoinGroup, SyncGroup, Heartbeat and OffsetCommit). In
a Stable group whose chosen protocol stays the same this starts no rebalance: the member
gets the current generation at once. A static member that does not rejoin a rebalance
stays a member (it is assigned to, and the group waits for it until the rebalance
timeout); only its session timeout or a LeaveGroup removes it.

Committed offsets are kept per group in one document (server/coordinator/offset_files.py: a file
under <data>/groups/, or an object beside the topics on S3, fenced by the writer's
epoch), replaced whole on every commit, so they survive restarts, crashes and, on S3, a
server taking over from another. Every write of them (commits, OffsetDelete's snapshot,
DeleteGroups) goes through one writer thread, in the order the event loop changed the
groups, so a deletion is never overtaken by an older snapshot. A write that fails
changes nothing the coordinator answers from: the offsets it was to record are put back
as they were, and the client gets COORDINATOR_NOT_AVAILABLE (retriable), or
NOT_COORDINATOR when another server owns the groups now (FencedError).

One concept past 500 lines: the coordinator is the one owner of the groups map, and
each method is one request of the classic protocol applied to it on the event loop (a
group's values are in group_model.py, static members in static_members.py, the offsets'
document in offset_files.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import FencedError, StorageError
from compactlog.log_throttle import Throttle, held_back
from compactlog.server.coordinator import static_members
from compactlog.server.coordinator.group_model import (
    COMPLETING,
    DEAD,
    EMPTY,
    MAX_GROUPS,
    MAX_SESSION_TIMEOUT_S,
    MIN_SESSION_TIMEOUT_S,
    PREPARING,
    STABLE,
    CommittedOffset,
    Group,
    GroupError,
    Member,
    Undo,
    forgettable,
    joining,
)
from compactlog.server.coordinator.offset_files import LocalOffsetFiles, OffsetFiles

log = logging.getLogger("compactlog.server.groups")
class GroupCoordinator:
    def __init__(self, source: Path | OffsetFiles, initial_rebalance_delay_s: float = 3.0,
                 min_session_timeout_s: float = MIN_SESSION_TIMEOUT_S,
                 max_session_timeout_s: float = MAX_SESSION_TIMEOUT_S,
                 max_groups: int = MAX_GROUPS) -> None:
        """`source`: a local data directory, or the offset documents (offset_files.py)."""
        self.files: OffsetFiles = (LocalOffsetFiles(source) if isinstance(source, Path)
                                   else source)
        self.initial_rebalance_delay_s = initial_rebalance_delay_s
        self.min_session_timeout_s = min_session_timeout_s
        self.max_session_timeout_s = max_session_timeout_s
        self.max_groups = max_groups
        self.groups: dict[str, Group] = {}
        self.pending = 0  # pending member ids, all groups together
        self._refusals = Throttle(60.0)
        # One thread writes offset files, so that snapshots land in commit order.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="compactlog-offsets")
        self._load()

    # -- persistence ------------------------------------------------------------------

    def _load(self) -> None:
        for body in self.files.load():
            try:
                group = Group(str(body["group_id"]))
                for entry in body["offsets"]:
                    group.offsets[(entry["topic"], int(entry["partition"]))] = CommittedOffset(
                        int(entry["offset"]), int(entry.get("leader_epoch", -1)),
                        entry.get("metadata"), int(entry.get("commit_ms", 0)))
            except (ValueError, KeyError, TypeError) as error:
                # One damaged document loses that group's offsets, not the server.
                log.error("ignoring damaged committed offsets of group %r: %r",
                          body.get("group_id"), error)
                continue
            self.groups[group.group_id] = group
        if self.groups:
            log.info("loaded committed offsets of %d group(s)", len(self.groups))

    @staticmethod
    def _snapshot(group: Group) -> dict[str, Any]:
        return {"group_id": group.group_id, "offsets": [
            {"topic": topic, "partition": partition, "offset": c.offset,
             "leader_epoch": c.leader_epoch, "metadata": c.metadata, "commit_ms": c.commit_ms}
            for (topic, partition), c in sorted(group.offsets.items())
        ]}

    async def _write(self, group: Group, undo: Undo) -> None:
        """Write `group`'s offsets; if that fails, put back the entries in `undo` that
        no later change replaced since, and raise GroupError."""
        body = self._snapshot(group)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._writer, self.files.write, group.group_id, body)
        except (OSError, StorageError, FencedError) as error:
            for key, (before, after) in undo.items():
                if group.offsets.get(key) is not after:
                    continue  # a later commit replaced it: its own write decides
                if before is None:
                    group.offsets.pop(key, None)
                else:
                    group.offsets[key] = before
            raise _write_failed(f"the offsets of group {group.group_id} could not be "
                                f"written to {self.files.where(group.group_id)}", error
                                ) from None

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    # -- membership -------------------------------------------------------------------

    def group(self, group_id: str) -> Group:
        """The group, made if new; GroupError(COORDINATOR_NOT_AVAILABLE) if that would
        be more than `max_groups`."""
        group = self.groups.get(group_id)
        if group is None:
            if len(self.groups) >= self.max_groups:
                raise self._full(f"{len(self.groups)} groups")
            group = self.groups[group_id] = Group(group_id)
        return group

    def _full(self, what: str) -> GroupError:
        held = self._refusals.allow(what.split()[-1])
        if held is not None:
            log.warning("refusing a new group or member id: the server holds %s, "
                        "max_groups (%d); groups left empty without committed offsets "
                        "and unused member ids expire%s", what, self.max_groups,
                        held_back(held))
        return GroupError(ErrorCode.coordinator_not_available,
                          f"the coordinator holds max_groups ({self.max_groups}) {what}")

    async def join(
        self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
        client_host: str, session_timeout_s: float, rebalance_timeout_s: float,
        protocol_type: str, protocols: list[tuple[str, bytes]], require_known_member_id: bool,
        skip_assignment: bool = False,
    ) -> dict[str, Any]:
        """Kafka's classic JoinGroup. `skip_assignment`: the request's version (v9+) lets
        a static leader that takes its own place over be told so (KIP-814)."""
        if not group_id:
            raise GroupError(ErrorCode.invalid_group_id, "the group id is empty")
        if not self.min_session_timeout_s <= session_timeout_s <= self.max_session_timeout_s:
            # Kafka's check, before any member is looked at or made.
            raise GroupError(
                ErrorCode.invalid_session_timeout,
                f"session timeout {session_timeout_s * 1000:.0f} ms is outside "
                f"{self.min_session_timeout_s * 1000:.0f}..{self.max_session_timeout_s * 1000:.0f}"
                " ms (group_min_session_timeout_s, group_max_session_timeout_s)")
        if not protocols:
            raise GroupError(ErrorCode.inconsistent_group_protocol, "no protocols offered")
        group = self.group(group_id)
        if group.members and group.protocol_type not in (None, protocol_type):
            raise GroupError(ErrorCode.inconsistent_group_protocol,
                             f"group {group_id} uses protocol type {group.protocol_type}")
        if group.members and not self._common_protocols(group.members.values(), protocols):
            raise GroupError(ErrorCode.inconsistent_group_protocol,
                             f"no protocol in common with the members of {group_id}")
        if not member_id and group_instance_id is not None:
            member_id = static_members.new_member_id(group_instance_id, str(uuid.uuid4()))
            old = static_members.holder(group, group_instance_id)
            if old is not None:
                return await self._rejoin_static(
                    group, old, member_id, session_timeout_s, rebalance_timeout_s,
                    protocol_type, protocols, skip_assignment)
        elif not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                # KIP-394: the client must come back with this id, so that a member that
                # retries a timed-out join is not counted twice. It expires after the
                # session timeout, as in Kafka.
                if self.pending >= self.max_groups:
                    raise self._full(f"{self.pending} pending member ids")
                group.pending_ids[member_id] = time.monotonic() + session_timeout_s
                self.pending += 1
                return {"error_code": ErrorCode.member_id_required, "member_id": member_id,
                        "generation_id": -1, "leader": "", "members": []}
        elif group_instance_id is not None or member_id not in group.pending_ids:
            # A pending member id is never static: naming an instance id with one is
            # refused as with any member id that does not hold it.
            self._validate(group, member_id, group_instance_id)
        if group.pending_ids.pop(member_id, None) is not None:
            self.pending -= 1
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, group_instance_id, client_id, client_host,
                            session_timeout_s, rebalance_timeout_s, protocol_type, protocols)
            group.members[member_id] = member
            log.info("group %s: member %s joined", group_id, member_id)
        else:
            member.protocols, member.protocol_type = protocols, protocol_type
            member.session_timeout_s = session_timeout_s
            member.rebalance_timeout_s = rebalance_timeout_s
        member.last_heartbeat = time.monotonic()
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.cancel()  # a retried join replaces the one in flight
        member.join_waiter = asyncio.get_running_loop().create_future()
        waiter = member.join_waiter
        group.protocol_type = protocol_type
        if group.state != PREPARING:
            self._prepare_rebalance(group, f"member {member_id} joined")
        self._maybe_complete_join(group)
        return await waiter

    async def _rejoin_static(
        self, group: Group, old: Member, member_id: str, session_timeout_s: float,
        rebalance_timeout_s: float, protocol_type: str, protocols: list[tuple[str, bytes]],
        skip_assignment: bool,
    ) -> dict[str, Any]:
        """Kafka's updateStaticMemberThenRebalanceOrCompleteJoin: a static member that
        rejoins with an empty member id takes `old`'s place under `member_id`; `old` is
        fenced. A Stable group whose protocol stays the same does not rebalance: the
        member is answered at once with the current generation, and its SyncGroup gets
        the assignment it had. Otherwise the group (re)balances as for any join."""
        old_leader = group.leader_id
        fenced = GroupError(ErrorCode.fenced_instance_id,
                            f"instance id {old.group_instance_id} rejoined as {member_id}")
        if old.join_waiter is not None and not old.join_waiter.done():
            old.join_waiter.set_exception(fenced)
        if old.sync_waiter is not None and not old.sync_waiter.done():
            old.sync_waiter.set_exception(fenced)
        member = static_members.replace(group, old, member_id)
        member.protocols, member.protocol_type = protocols, protocol_type
        member.session_timeout_s = session_timeout_s
        member.rebalance_timeout_s = rebalance_timeout_s
        log.info("group %s: static member %s (instance id %s) replaced %s in state %s",
                 group.group_id, member_id, member.group_instance_id, old.member_id,
                 group.state)
        if group.state == STABLE and group.protocol_name == self._choose_protocol(group):
            leader = member_id == group.leader_id
            return {"error_code": ErrorCode.none, "generation_id": group.generation,
                    "protocol_type": group.protocol_type,
                    "protocol_name": group.protocol_name,
                    # v9+: the leader learns its own new id, and not to assign again;
                    # before, it is told the leader it knew, and acts as a follower.
                    "leader": group.leader_id if skip_assignment else old_leader,
                    "skip_assignment": skip_assignment and leader,
                    "member_id": member_id,
                    "members": _leader_view(group) if skip_assignment and leader else []}
        member.join_waiter = asyncio.get_running_loop().create_future()
        waiter = member.join_waiter
        if group.state != PREPARING:
            # CompletingRebalance too: the leader may be assigning to the old member id.
            self._prepare_rebalance(group, f"static member {member_id} replaced "
                                           f"{old.member_id}")
        self._maybe_complete_join(group)
        return await waiter

    @staticmethod
    def _validate(group: Group, member_id: str, instance_id: str | None) -> None:
        invalid = static_members.invalid_member(group, member_id, instance_id)
        if invalid is not None:
            raise GroupError(*invalid)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state == COMPLETING:
            # Members waiting for their assignment must rejoin first.
            for member in group.members.values():
                self._fail_sync(member, ErrorCode.rebalance_in_progress)
        group.initial_wait = group.state == EMPTY and self.initial_rebalance_delay_s > 0
        group.state = PREPARING
        log.info("group %s: rebalancing (%s)", group.group_id, reason)
        timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=0.0)
        if group.rebalance_task is not None:
            group.rebalance_task.cancel()
        group.rebalance_task = asyncio.get_running_loop().create_task(
            self._rebalance_deadline(group, timeout))

    async def _rebalance_deadline(self, group: Group, timeout: float) -> None:
        started = time.monotonic()
        if group.initial_wait:
            await asyncio.sleep(self.initial_rebalance_delay_s)
            group.initial_wait = False
            if self._all_joined(group):
                self._complete_join(group)
                return
        await asyncio.sleep(max(timeout - (time.monotonic() - started), 0.0))
        if group.state != PREPARING:
            return
        for member in [m for m in group.members.values() if not joining(m)]:
            if member.group_instance_id is not None:
                continue  # static: only its session timeout or a LeaveGroup removes it
            log.info("group %s: member %s did not rejoin in time; removed",
                     group.group_id, member.member_id)
            del group.members[member.member_id]
        if group.members and not any(joining(m) for m in group.members.values()):
            # Only static members, none rejoined: no leader to form a generation with.
            # Wait on until one rejoins or their session timeouts remove them (Kafka
            # waits another rebalance timeout the same way).
            group.rebalance_task = asyncio.get_running_loop().create_task(
                self._rebalance_deadline(group, timeout))
            return
        self._complete_join(group)

    def _all_joined(self, group: Group) -> bool:
        return all(joining(m) for m in group.members.values())

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state == PREPARING and self._all_joined(group) and not group.initial_wait:
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.rebalance_task is not None and group.rebalance_task is not asyncio.current_task():
            group.rebalance_task.cancel()
        group.rebalance_task = None
        group.generation += 1
        if not group.members:
            group.state, group.leader_id, group.protocol_name = EMPTY, None, None
            group.protocol_type = None
            log.info("group %s: generation %d, empty", group.group_id, group.generation)
            return
        group.state = COMPLETING
        protocol = self._choose_protocol(group)
        group.protocol_name = protocol
        if group.leader_id not in group.members or not joining(group.members[group.leader_id]):
            # The leader must be told it leads: one that rejoined (a static member that
            # did not is still a member, and is assigned to as such).
            group.leader_id = next(m.member_id for m in group.members.values() if joining(m))
        members_of_leader = _leader_view(group)
        log.info("group %s: generation %d with %d member(s), protocol %s, leader %s",
                 group.group_id, group.generation, len(group.members), protocol,
                 group.leader_id)
        for member in group.members.values():
            member.assignment = b""
            waiter = member.join_waiter
            member.join_waiter = None
            if waiter is not None and not waiter.done():
                waiter.set_result({
                    "error_code": ErrorCode.none, "generation_id": group.generation,
                    "protocol_type": group.protocol_type, "protocol_name": protocol,
                    "leader": group.leader_id, "skip_assignment": False,
                    "member_id": member.member_id,
                    "members": members_of_leader if member.member_id == group.leader_id else [],
                })

    @staticmethod
    def _common_protocols(members: Iterable[Member], offered: list[tuple[str, bytes]]) -> bool:
        names = {name for name, _ in offered}
        return all(names & {name for name, _ in m.protocols} for m in members)

    @staticmethod
    def _choose_protocol(group: Group) -> str:
        members = list(group.members.values())
        common = set.intersection(*({name for name, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for member in members:
            choice = next(name for name, _ in member.protocols if name in common)
            votes[choice] = votes.get(choice, 0) + 1
        # Most votes wins; ties go to the leader's (first member's) preference order.
        order = [name for name, _ in members[0].protocols if name in common]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))

    def _member(
        self, group_id: str, member_id: str, generation: int | None,
        instance_id: str | None = None,
    ) -> tuple[Group, Member]:
        """The member, checked as Kafka's validateMember (with `instance_id`, it must be
        the member holding it: else FENCED_INSTANCE_ID), then its generation."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"member {member_id!r} is not in group {group_id!r}")
        self._validate(group, member_id, instance_id)
        if generation is not None and generation != group.generation:
            raise GroupError(ErrorCode.illegal_generation,
                             f"generation {generation} is not the group's "
                             f"({group.generation})")
        return group, group.members[member_id]

    async def sync(self, group_id: str, member_id: str, generation: int,
                   assignments: dict[str, bytes],
                   instance_id: str | None = None) -> dict[str, Any]:
        group, member = self._member(group_id, member_id, generation, instance_id)
        member.last_heartbeat = time.monotonic()
        if group.state == PREPARING:
            raise GroupError(ErrorCode.rebalance_in_progress)
        answer = {"error_code": ErrorCode.none, "protocol_type": group.protocol_type,
                  "protocol_name": group.protocol_name}
        if group.state == STABLE:
            return {**answer, "assignment": member.assignment}
        if member_id == group.leader_id:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            group.state = STABLE
            log.info("group %s: generation %d is stable", group_id, group.generation)
            for other in group.members.values():
                if other.sync_waiter is not None and not other.sync_waiter.done():
                    other.sync_waiter.set_result(other.assignment)
                other.sync_waiter = None
            return {**answer, "assignment": member.assignment}
        member.sync_waiter = asyncio.get_running_loop().create_future()
        assignment = await member.sync_waiter
        return {**answer, "protocol_name": group.protocol_name, "assignment": assignment}

    def _fail_sync(self, member: Member, code: ErrorCode) -> None:
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_exception(GroupError(code))
        member.sync_waiter = None

    def heartbeat(self, group_id: str, member_id: str, generation: int,
                  instance_id: str | None = None) -> None:
        group, member = self._member(group_id, member_id, None, instance_id)
        member.last_heartbeat = time.monotonic()
        if group.state == PREPARING:
            raise GroupError(ErrorCode.rebalance_in_progress)
        if generation != group.generation:
            raise GroupError(ErrorCode.illegal_generation)

    def leave(self, group_id: str,
              leaving: list[tuple[str, str | None, str | None]]) -> list[ErrorCode]:
        """Kafka's LeaveGroup (GroupMetadataManager.classicGroupLeaveToClassicGroup): one
        code per (member id, group instance id, reason) in `leaving`. v0-v2 name one
        member by id; v3+ name many, and an admin may name a static member by its
        instance id alone (empty member id). A pending member id (handed out with
        MEMBER_ID_REQUIRED, not yet joined with) is forgotten, as Kafka forgets its
        pending members, so a client that closes between its two JoinGroups leaves
        nothing behind. An unknown member (or group) gets UNKNOWN_MEMBER_ID; a member id
        that is not the one holding the instance id named, FENCED_INSTANCE_ID."""
        group = self.groups.get(group_id)
        if group is None:
            return [ErrorCode.unknown_member_id] * len(leaving)
        # Kafka's staticMemberId map, built once: a request may name many members.
        static = {m.group_instance_id: m for m in group.members.values()
                  if m.group_instance_id is not None}
        codes = []
        for member_id, instance_id, reason in leaving:
            said = f" (reason: {reason})" if reason else ""  # v5+; Kafka logs it too
            why = f"left the group{said}"
            holder = None if instance_id is None else static.get(instance_id)
            if not member_id and holder is not None:
                leaver: Member | None = holder
                why = f"was removed by its instance id {instance_id}{said}"
            elif member_id and group.pending_ids.pop(member_id, None) is not None:
                self.pending -= 1
                log.info("group %s: pending member %s %s", group_id, member_id, why)
                codes.append(ErrorCode.none)
                continue
            elif instance_id is not None and (holder is None or holder.member_id != member_id):
                # Kafka's validateMember: the instance id must be held, by this member.
                codes.append(ErrorCode.unknown_member_id if holder is None
                             else ErrorCode.fenced_instance_id)
                continue
            else:
                leaver = group.members.get(member_id)
            if leaver is None:
                codes.append(ErrorCode.unknown_member_id)
                continue
            if leaver.group_instance_id is not None:
                static.pop(leaver.group_instance_id, None)
            self._remove(group, leaver, why)
            codes.append(ErrorCode.none)
        return codes

    def _remove(self, group: Group, member: Member, why: str) -> None:
        del group.members[member.member_id]
        log.info("group %s: member %s %s", group.group_id, member.member_id, why)
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_exception(GroupError(ErrorCode.unknown_member_id))
        self._fail_sync(member, ErrorCode.unknown_member_id)
        if group.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(group, f"member {member.member_id} {why}")
        self._maybe_complete_join(group)

    def expire_sessions(self, now: float | None = None) -> None:
        """Remove members whose session timed out and pending member ids past theirs,
        then groups left empty without committed offsets; called periodically."""
        now = time.monotonic() if now is None else now
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if joining(member):
                    continue  # a member waiting in JoinGroup is bounded by the rebalance
                if now - member.last_heartbeat > member.session_timeout_s:
                    self._remove(group, member, "missed its session timeout")
            if group.pending_ids:
                expired = [m for m, deadline in group.pending_ids.items() if now > deadline]
                for member_id in expired:
                    del group.pending_ids[member_id]
                self.pending -= len(expired)
            if forgettable(group):
                # Kafka's cleanup: an Empty group without offsets is Dead, and goes.
                del self.groups[group.group_id]

    # -- offsets ----------------------------------------------------------------------

    async def commit(self, group_id: str, member_id: str, generation: int,
                     offsets: dict[tuple[str, int], tuple[int, int, str | None]],
                     instance_id: str | None = None) -> None:
        """Record offsets; returns once they are durable."""
        group = self.group(group_id)
        if generation < 0 and group.state == EMPTY:
            # Kafka's ClassicGroup.validateOffsetCommit: generation -1 on an Empty group
            # is an admin client or a consumer outside group management, and commits
            # whatever member id it names (there is no member to check it against).
            pass
        elif generation >= 0 or member_id or instance_id is not None:
            # A member's commit must come from the current generation, so that a zombie
            # cannot overwrite what the new owner of a partition committed.
            # As Kafka: during PreparingRebalance the current generation may still commit
            # (consumers commit before they give up partitions); once the new generation
            # is formed and waits for its assignment, it may not.
            _, _ = self._member(group_id, member_id, generation, instance_id)
            if group.state == COMPLETING:
                raise GroupError(ErrorCode.rebalance_in_progress)
        elif group.members:
            raise GroupError(ErrorCode.unknown_member_id,
                             f"group {group_id} has members; commit as one of them")
        now_ms = int(time.time() * 1000)
        undo: Undo = {}
        for key, (offset, epoch, metadata) in offsets.items():
            committed = CommittedOffset(offset, epoch, metadata, now_ms)
            undo[key] = (group.offsets.get(key), committed)
            group.offsets[key] = committed
        await self._write(group, undo)

    def fetch_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        group = self.groups.get(group_id)
        return dict(group.offsets) if group else {}

    # -- deleting (admin) ----------------------------------------------------------------

    async def delete_groups(self, group_ids: list[str]) -> list[ErrorCode]:
        """Kafka's DeleteGroups (ClassicGroup.validateDeleteGroup): an empty group goes,
        with its committed offsets, durably; a group with members gets NON_EMPTY_GROUP
        and an unknown one GROUP_ID_NOT_FOUND."""
        codes: list[ErrorCode] = []
        doomed: dict[str, Group] = {}
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group_id in doomed:  # named twice: the same answer twice
                codes.append(ErrorCode.none)
            elif group is None:
                codes.append(ErrorCode.group_id_not_found)
            elif group.members or group.state != EMPTY:
                codes.append(ErrorCode.non_empty_group)
            else:
                del self.groups[group_id]
                self.pending -= len(group.pending_ids)
                doomed[group_id] = group
                codes.append(ErrorCode.none)
        if doomed:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._writer, self.files.delete, list(doomed))
            except (OSError, StorageError, FencedError) as error:
                log.error("deleting groups %s failed, so they stay: %s", list(doomed), error)
                for group_id, group in doomed.items():
                    if self.groups.setdefault(group_id, group) is group:
                        self.pending += len(group.pending_ids)
                # Kafka answers a failed coordinator write with a retriable error.
                failed = _write_failed("", error).code
                return [failed if g in doomed else code
                        for g, code in zip(group_ids, codes, strict=True)]
            log.info("deleted group(s) %s with their committed offsets", ", ".join(doomed))
        return codes

    def offsets_deletable(self, group_id: str) -> Group:
        """The group whose offsets OffsetDelete may delete (ClassicGroup.
        validateOffsetDelete): GROUP_ID_NOT_FOUND if unknown; NON_EMPTY_GROUP if it has
        members and they do not use the consumer protocol (whose subscriptions say which
        topics are in use)."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError(ErrorCode.group_id_not_found, f"no group {group_id!r}")
        if (group.members or group.state != EMPTY) and group.protocol_type != "consumer":
            raise GroupError(ErrorCode.non_empty_group,
                             f"group {group_id!r} has members")
        return group

    async def delete_offsets(self, group: Group, keys: list[tuple[str, int]]) -> None:
        """Forget these committed offsets of `group` (from `offsets_deletable`), durably;
        GroupError(COORDINATOR_NOT_AVAILABLE) if the write fails (nothing is deleted)."""
        removed = {key: group.offsets.pop(key) for key in keys if key in group.offsets}
        if not removed:
            return
        await self._write(group, {key: (before, None) for key, before in removed.items()})
        log.info("group %s: deleted committed offsets of %s", group.group_id,
                 ", ".join(f"{topic}/{partition}" for topic, partition in sorted(removed)))

    def describe(self, group_id: str) -> dict[str, Any]:
        group = self.groups.get(group_id)
        if group is None:
            return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": DEAD,
                    "protocol_type": "", "protocol_data": "", "members": []}
        return {
            "error_code": ErrorCode.none, "group_id": group_id, "group_state": group.state,
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name or "",
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "client_id": m.client_id, "client_host": m.client_host,
                 "member_metadata": (m.metadata_for(group.protocol_name)
                                     if group.protocol_name else b""),
                 "member_assignment": m.assignment}
                for m in group.members.values()
            ],
            "authorized_operations": -2147483648,
        }


def _write_failed(what: str, error: BaseException) -> GroupError:
    """Kafka answers a failed coordinator write with a retriable error: NOT_COORDINATOR
    when another server owns the groups now, else COORDINATOR_NOT_AVAILABLE."""
    code = (ErrorCode.not_coordinator if isinstance(error, FencedError)
            else ErrorCode.coordinator_not_available)
    return GroupError(code, f"{what}: {error}" if what else str(error))


def _leader_view(group: Group) -> list[dict[str, Any]]:
    """The members as JoinGroup tells the leader of them, with the group's protocol's
    metadata."""
    protocol = group.protocol_name or ""
    return [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "metadata": m.metadata_for(protocol)} for m in group.members.values()]
