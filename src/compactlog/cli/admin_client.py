"""A small client of the server's admin API (server/admin/http_api.py), for `--server URL`."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from compactlog.compaction import CompactionReport, PartitionSummary
from compactlog.errors import ConflictError, UserError

TIMEOUT_S = 30.0
# A bearer token for a server whose admin API wants one (docs/server.md, "Authorization").
TOKEN_ENV = "COMPACTLOG_ADMIN_TOKEN"


class AdminClient:
    def __init__(self, url: str) -> None:
        if not url.startswith(("http://", "https://")):
            url = f"http://{url}"
        self.url = url.rstrip("/")

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: Any) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        token = os.environ.get(TOKEN_ENV)
        if token:
            headers["Authorization"] = f"Bearer {token.strip()}"
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = _error_body(error)
            message = str(body.get("error", error.reason))
            if error.code == 409:
                raise BusyServerError(message, body.get("runs", [])) from None
            if error.code == 401:
                message += f" (set {TOKEN_ENV} to a token of the server's admin tokens file)"
            raise UserError(f"the server at {self.url} answered {error.code}: {message}") \
                from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise UserError(f"cannot reach the compactlog admin API at {self.url}: {reason} "
                            "(is the server running with --admin-listen?)") from None
        except ValueError as error:
            raise UserError(f"the server at {self.url} answered something that is not "
                            f"JSON: {error}") from None


class BusyServerError(ConflictError):
    """409: a compaction is already running; `runs` are the server's runs in the way."""

    def __init__(self, message: str, runs: list[int]) -> None:
        super().__init__(message)
        self.runs = runs


def _error_body(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        body = json.loads(error.read())
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def report_from_json(body: dict[str, Any]) -> CompactionReport:
    """The report `compactlog compact --json` prints, back as a CompactionReport."""
    names = set(PartitionSummary.__dataclass_fields__)
    return CompactionReport(
        topic=body["topic"],
        run_id=body["run_id"],
        duration_s=body["duration_s"],
        partitions=[PartitionSummary(**{k: v for k, v in p.items() if k in names})
                    for p in body["partitions"]],
        stages=dict(body.get("stages", {})),
        startup_s=body.get("startup_s", 0.0),
        engine=body.get("engine", ""),
        io_read_bytes=body.get("io_read_bytes", 0),
        io_written_bytes=body.get("io_written_bytes", 0),
        throttled_s=body.get("throttled_s", 0.0),
    )
