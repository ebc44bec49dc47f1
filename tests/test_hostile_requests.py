"""Requests from an authenticated (or anonymous, on PLAINTEXT) client that cost the
server more than they should (issue 25, items 2, 3, 4, 5 and 10), against a real
`compactlog serve`, with what each cost read from the server process (/proc).

Each test names the numbers measured before its fix in its docstring.
"""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from hostile_support import FETCH, fetch_frame, hostile_server, read_response
from process_usage import Usage
from test_server_bad_input import Wire

AUTHORIZER_ON = "[authorization]\nenabled = true\n"


# -- item 5: the log throttle and what it is keyed by ----------------------------------


def test_denials_of_many_made_up_topics_cost_linear_cpu_and_log_one_line(
        tmp_path: Path) -> None:
    """A principal with no ACL fetches 13,000 made-up topic names. Every one is denied
    (TOPIC_AUTHORIZATION_FAILED), but the denial log is throttled by what the client
    cannot choose (principal, host, operation, resource type), so the throttle holds
    one key, not 13,000, and the server logs one line. Before: the throttle was keyed
    by topic name and rebuilt its dict on every call past 10,000 keys: 13,000 names
    took 7.6 s of server CPU and logged 13,000 lines."""
    names = [f"made-up-{n:05d}" for n in range(13_000)]
    with hostile_server(tmp_path, AUTHORIZER_ON) as hostile, \
            Wire(hostile.address(), timeout=60) as wire:
        mark = hostile.server.mark()
        with Usage(hostile.pid) as usage:
            wire.send(fetch_frame([(name, 0, 0) for name in names]))
            body = read_response(wire, FETCH, 12)
        codes = {part.error_code for topic in body.responses for part in topic.partitions}
        assert codes == {ErrorCode.topic_authorization_failed}
        assert sum(len(topic.partitions) for topic in body.responses) == len(names)
        print(f"13,000 denied names: {usage}")
        assert usage.cpu < 2.0, f"{usage}"
        denials = [line for line in hostile.server.log_since(mark).splitlines()
                   if "is Denied Operation = READ" in line]
        assert 1 <= len(denials) <= 2, denials[:5]
        assert "User:ANONYMOUS" in denials[0] and "TOPIC:made-up-" in denials[0]
