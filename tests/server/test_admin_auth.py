"""The admin API's principals (server/admin/route_access.py): the tokens file's format, its
reload on change, refusals that never echo a token, and the order of the sources."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from compactlog.errors import UserError
from compactlog.server.admin.route_access import AdminAuth, TokenFile, Unauthenticated

TOKEN = "t0k3n-" + "x" * 30


class FakeRequest:
    def __init__(self, authorization: str | None = None) -> None:
        self.headers: dict[str, str] = (
            {} if authorization is None else {"Authorization": authorization})
        self.transport = None


def tokens_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    return path


def test_the_file_maps_tokens_to_principals(tmp_path: Path) -> None:
    tokens = TokenFile(tokens_file(tmp_path, f"# ops\n\nUser:ops {TOKEN}\nUser:ci other\n"))
    assert tokens.principal_of(TOKEN) == "User:ops"
    assert tokens.principal_of("other") == "User:ci"
    assert tokens.principal_of(TOKEN[:-1]) is None
    assert tokens.principal_of("") is None


def test_a_bad_line_is_refused_without_echoing_it(tmp_path: Path) -> None:
    for text in (f"User:ops {TOKEN} extra\n", f"{TOKEN}\n", f"ops {TOKEN}\n"):
        with pytest.raises(UserError) as raised:
            TokenFile(tokens_file(tmp_path, text))
        assert TOKEN not in str(raised.value) and "line 1" in str(raised.value)
    with pytest.raises(UserError, match="No such file"):
        TokenFile(tmp_path / "missing")


def test_changes_are_read_without_a_restart(tmp_path: Path) -> None:
    path = tokens_file(tmp_path, f"User:ops {TOKEN}\n")
    tokens = TokenFile(path)
    assert tokens.principal_of(TOKEN) == "User:ops"
    path.write_text("User:ci new-token-0123456789\n")
    os.utime(path, ns=(1, 1))  # a new stamp even within the clock's resolution
    assert tokens.principal_of(TOKEN) is None  # revoked
    assert tokens.principal_of("new-token-0123456789") == "User:ci"
    path.write_text("broken line with three\n")
    os.utime(path, ns=(2, 2))
    # A file broken while serving: the last good tokens stay.
    assert tokens.principal_of("new-token-0123456789") == "User:ci"


def test_the_sources_in_order(tmp_path: Path) -> None:
    tokens = TokenFile(tokens_file(tmp_path, f"User:ops {TOKEN}\n"))
    auth = AdminAuth(tokens)
    assert auth.principal(FakeRequest(f"Bearer {TOKEN}")) == "User:ops"
    for header in (None, "Bearer nope", "Basic abc", "Bearer "):
        with pytest.raises(Unauthenticated) as raised:
            auth.principal(FakeRequest(header))
        assert "nope" not in str(raised.value)
    # No tokens file: no header is anonymous, a token is refused (there are none).
    open_auth = AdminAuth(None)
    assert open_auth.principal(FakeRequest()) == "User:ANONYMOUS"
    with pytest.raises(Unauthenticated):
        open_auth.principal(FakeRequest(f"Bearer {TOKEN}"))
    # A source ahead of the token (a TLS client certificate) wins.

    def certificate(request: Any) -> str | None:
        return "User:CN=alice,O=acme"

    with_cert = AdminAuth(tokens, principal_sources=(certificate,))
    assert with_cert.principal(FakeRequest(f"Bearer {TOKEN}")) == "User:CN=alice,O=acme"
