"""The lower findings of issue 25, item 14, against a real `compactlog serve`: what a
refusal, a log line, a file mode or the metrics page tell someone who should not know,
and what a broken setting lets through.

Each test names what happened before its fix in its docstring.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from kio.schema.errors import ErrorCode

from hostile_support import hostile_server
from test_server_bad_input import Wire, request_frame

CREATE_TOPICS = 19


def create_topic(wire: Wire, name: str, configs: dict[str, str]) -> object:
    wire.send(request_frame(CREATE_TOPICS, 5, {
        "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout": timedelta(seconds=30), "validate_only": False}))
    _, body = wire.response(CREATE_TOPICS, 5)
    return body.topics[0]


def test_a_refused_function_strategy_does_not_echo_the_allow_list(tmp_path: Path) -> None:
    """A client that names a function: strategy the server does not allow gets
    INVALID_CONFIG saying so and which setting allows it, but not what the server
    allows: the allow-list names the code the server runs, which is the operator's.
    Before: the message listed every allowed MODULE:NAME."""
    settings = ('[compaction]\nallowed_strategy_functions = '
                '["acme_internal.billing:latest_invoice"]\n')
    with hostile_server(tmp_path, settings) as hostile, Wire(hostile.address()) as wire:
        answer = create_topic(wire, "x", {"cleanup.policy": "compact",
                                          "compaction.strategy": "function:os:system"})
        assert answer.error_code == ErrorCode.invalid_config, answer
        assert "compaction.allowed_strategy_functions" in answer.error_message
        assert "acme_internal" not in answer.error_message, answer.error_message
        assert not (hostile.data_dir / "topics" / "x").exists()
