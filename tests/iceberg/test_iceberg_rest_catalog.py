"""The read-only Iceberg REST catalog on the admin listener (compactlog/iceberg/catalog.py,
server/admin/iceberg_catalog.py), attached by real engines against a real server process:
pyiceberg 0.12's RestCatalog and DuckDB 1.5.5's iceberg extension (ATTACH ... TYPE
iceberg) list the `state` namespace's tables and read each one equal to the Reader's
compacted view up to its horizons, with authentication off and on. docs/querying.md's
"The REST catalog" blocks run as written, each in a Python of its own without this
checkout on its path, with only the port and the token changed (and, with no tokens
file, the substitution the page gives). With the authorizer on, a principal without
DESCRIBE on a topic does not see its table and cannot load it. On S3 (moto's server on
loopback) the engines read the s3:// files the metadata names with their own settings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_httpfs
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, UnauthorizedError

from compactlog.server.security.acl_model import AclBinding, Operation, PatternType, Permission
from compactlog.server.security.acl_model import ResourceType as Kind
from compactlog.server.security.authorizer import AuthorizationConfig, Authorizer
from compactlog.storage.store import LogStore
from support.iceberg_readers import StateRow, _row, duckdb_connection, extension_path
from support.iceberg_support import (
    CONFIG,
    compact,
    duckdb_on_s3,
    expected_state,
    produce,
    pyiceberg_properties,
    updates,
)
from support.kafka_server import LoggedServer, logged_server
from support.paths import ROOT
from support.s3_support import S3Server

DOC = ROOT / "docs" / "querying.md"
SECTION = "## The REST catalog"
DOC_URL = "http://127.0.0.1:9093"
DOC_TOKEN = "3f6a0c5e9d1b47f2a8c4e7b6d5a3f1e0c9b8a7d6e5f4a3b2"
READER_TOKEN = "reader-" + "r" * 40  # DESCRIBE on prices only
NOBODY_TOKEN = "nobody-" + "n" * 40  # no ACL at all
COLUMNS = ["partition", "offset", "key", "value", "headers"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[StateRow]]]:
    """Compacted topics `prices` and `secret` (each with its state table), `fresh`
    (compacted, never compacted: no table yet) and `plain` (not compacted)."""
    root = tmp_path_factory.mktemp("rest-catalog")
    data_dir = root / "data"
    expected: dict[str, list[StateRow]] = {}
    with LogStore.open(data_dir) as store:
        for topic, partitions in (("prices", 2), ("secret", 1)):
            store.create_topic(topic, partitions, CONFIG)
            produce(store, updates(0, 300, 40, tombstone_every=9), topic)
            compact(store, topic)
            produce(store, updates(300, 20, 40), topic)  # above the horizon: not in it
            expected[topic] = expected_state(store, topic)
            assert expected[topic]
        store.create_topic("fresh", 1, CONFIG)
        store.create_topic("plain", 1, {})
    Authorizer(data_dir, AuthorizationConfig(enabled=True)).create([
        AclBinding(Kind.TOPIC, "prices", PatternType.LITERAL, "User:reader", "*",
                   Operation.DESCRIBE, Permission.ALLOW),
        AclBinding(Kind.TOPIC, "secret", PatternType.LITERAL, "User:ANONYMOUS", "*",
                   Operation.DESCRIBE, Permission.ALLOW)])
    return root, expected


@contextmanager
def server(root: Path, authenticated: bool, authorizer: bool | None = None
           ) -> Iterator[LoggedServer]:
    """`authenticated`: a tokens file (a principal required) and the authorizer on;
    `authorizer` alone: the authorizer on, requests without a token User:ANONYMOUS."""
    settings = "[authorization]\n"
    if authorizer if authorizer is not None else authenticated:
        settings += "enabled = true\n"
    if authenticated:
        tokens = root / "admin-tokens"
        tokens.write_text(f"User:reader {READER_TOKEN}\nUser:nobody {NOBODY_TOKEN}\n")
        tokens.chmod(0o600)
        settings += f"admin_tokens_file = {json.dumps(str(tokens))}\n"
    config = root / "server.toml"
    config.write_text(settings)
    extra = ["--config", str(config)]
    log = root / f"server-{'auth' if authenticated else 'open'}-{authorizer}.log"
    with logged_server(root / "data", log, "--admin-listen", "127.0.0.1:0", *extra) as running:
        yield running


def catalog_url(running: LoggedServer) -> str:
    return f"{running.admin_url}/iceberg"


def pyiceberg_catalog(running: LoggedServer, token: str | None) -> Catalog:
    auth: dict[str, Any] = {"token": token} if token else {"auth": {"type": "noop"}}
    return load_catalog("c", type="rest", uri=catalog_url(running), **auth)


def pyiceberg_rows(catalog: Catalog, topic: str) -> list[StateRow]:
    table = catalog.load_table(("state", topic)).scan().to_arrow().select(COLUMNS)
    return sorted(_row(**row) for row in table.to_pylist())


def duckdb_catalog(running: LoggedServer, token: str | None) -> duckdb.DuckDBPyConnection:
    con = duckdb_connection()
    con.execute(f"LOAD '{extension_path(duckdb_extension_httpfs)}'")
    if token:
        con.execute(f"CREATE SECRET catalog_token (TYPE iceberg, TOKEN '{token}')")
        how = "SECRET catalog_token"
    else:
        how = "AUTHORIZATION_TYPE 'none'"
    con.execute(f"ATTACH 'compactlog' AS c (TYPE iceberg, "
                f"ENDPOINT '{catalog_url(running)}', {how})")
    return con


def duckdb_rows(con: duckdb.DuckDBPyConnection, topic: str) -> list[StateRow]:
    found = con.execute('SELECT partition, "offset", key, value, headers '
                        f'FROM c.state."{topic}"').fetchall()
    return sorted(_row(*row) for row in found)


def duckdb_tables(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    return sorted((schema, name) for database, schema, name, *_ in
                  con.execute("SHOW ALL TABLES").fetchall() if database == "c")


def http(method: str, url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method, headers=(
        {"Authorization": f"Bearer {token}"} if token else {}))
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    return status, json.loads(text) if text else None


# -- docs/querying.md's blocks ------------------------------------------------------------


def doc_blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION) + len(SECTION):]
    if "\n## " in section:
        section = section[:section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def as_run(block: str, running: LoggedServer, token: str | None) -> str:
    """The block with the test server's port and token; with no token, the page's
    substitution for a server without a tokens file."""
    assert DOC_URL in block and DOC_TOKEN in block
    block = block.replace(DOC_URL, running.admin_url or "")
    if token:
        return block.replace(DOC_TOKEN, token)
    block = re.sub(r'token="[^"]*"', 'auth={"type": "noop"}', block)
    block = re.sub(r'con\.execute\("CREATE SECRET.*?"\)\n', "", block, flags=re.S)
    return block.replace("SECRET catalog_token", "AUTHORIZATION_TYPE 'none'")


def run_block(block: str, cwd: Path) -> str:
    assert "import compactlog" not in block and "from compactlog" not in block
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", block], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def partition_counts(rows: list[StateRow]) -> list[tuple[int, int]]:
    counts: dict[int, int] = {}
    for row in rows:
        counts[row[0]] = counts.get(row[0], 0) + 1
    return sorted(counts.items())


def check_doc_blocks(running: LoggedServer, root: Path, token: str | None,
                     expected: list[StateRow], tables: list[tuple[str, str]]) -> None:
    pyiceberg_block, duckdb_block = doc_blocks()
    lines = run_block(as_run(pyiceberg_block, running, token), root).splitlines()
    assert lines == [repr(tables), f"{len(expected)} keys"]
    printed = run_block(as_run(duckdb_block, running, token), root)
    found = [(int(p), int(k)) for p, k in re.findall(r"│\s*(\d+)\s*│\s*(\d+)\s*│", printed)]
    assert found == partition_counts(expected), printed


def test_the_page_has_the_two_examples() -> None:
    pyiceberg_block, duckdb_block = doc_blocks()
    assert "load_catalog" in pyiceberg_block and "token=" in pyiceberg_block
    assert "TYPE iceberg" in duckdb_block and "duckdb_extension_httpfs" in duckdb_block


# -- authentication off ---------------------------------------------------------------------


def test_pyiceberg_and_duckdb_attach_without_authentication(
        data: tuple[Path, dict[str, list[StateRow]]]) -> None:
    root, expected = data
    with server(root, authenticated=False) as running:
        check_doc_blocks(running, root, None, expected["prices"],
                         [("state", "prices"), ("state", "secret")])

        catalog = pyiceberg_catalog(running, None)
        assert catalog.list_namespaces() == [("raw",), ("state",)]
        assert catalog.list_namespaces(("state",)) == []
        assert catalog.namespace_exists("state") and not catalog.namespace_exists("nope")
        assert catalog.load_namespace_properties("state") == {}
        assert catalog.list_tables("state") == [("state", "prices"), ("state", "secret")]
        for topic in ("prices", "secret"):
            assert pyiceberg_rows(catalog, topic) == expected[topic]
        assert catalog.table_exists(("state", "prices"))
        for missing in ("fresh", "plain", "nope"):  # no table yet, not compacted, no topic
            assert not catalog.table_exists(("state", missing))
            with pytest.raises(NoSuchTableError):
                catalog.load_table(("state", missing))

        con = duckdb_catalog(running, None)
        assert duckdb_tables(con) == [("state", "prices"), ("state", "secret")]
        for topic in ("prices", "secret"):
            assert duckdb_rows(con, topic) == expected[topic]
        with pytest.raises(duckdb.Error, match="405"):
            con.execute("DROP TABLE c.state.prices")

        # Every error under /iceberg has the spec's ErrorModel; writes are refused.
        url = catalog_url(running)
        status, body = http("POST", f"{url}/v1/namespaces/state/tables")
        assert status == 405
        assert body["error"]["type"] == "UnsupportedOperationException"
        assert body["error"]["code"] == 405 and "read-only" in body["error"]["message"]
        assert http("DELETE", f"{url}/v1/namespaces/state")[0] == 405
        status, body = http("GET", f"{url}/v1/namespaces/nope")
        assert (status, body["error"]["type"]) == (404, "NoSuchNamespaceException")
        status, body = http("GET", f"{url}/v1/namespaces/state/tables/plain")
        assert (status, body["error"]["type"]) == (404, "NoSuchTableException")
        assert "not compacted" in body["error"]["message"]
        assert http("HEAD", f"{url}/v1/namespaces/state/tables/prices")[0] == 204
        status, body = http("GET", f"{url}/v1/config")
        assert status == 200 and body["overrides"] == {}
        assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in body["endpoints"]
        # The admin API keeps its own error shape.
        status, body = http("GET", f"{running.admin_url}/v1/topics/nope")
        assert status == 404 and isinstance(body["error"], str)


# -- authentication and ACLs on -------------------------------------------------------------


def test_a_principal_sees_only_the_tables_it_may_describe(
        data: tuple[Path, dict[str, list[StateRow]]]) -> None:
    root, expected = data
    with server(root, authenticated=True) as running:
        check_doc_blocks(running, root, READER_TOKEN, expected["prices"],
                         [("state", "prices")])

        reader = pyiceberg_catalog(running, READER_TOKEN)
        assert reader.list_tables("state") == [("state", "prices")]
        assert pyiceberg_rows(reader, "prices") == expected["prices"]
        # Refused before it is looked up: the same for a topic that exists or not.
        for hidden in ("secret", "nope"):
            with pytest.raises(ForbiddenError, match="User:reader"):
                reader.load_table(("state", hidden))

        nobody = pyiceberg_catalog(running, NOBODY_TOKEN)
        assert nobody.list_namespaces() == [("raw",), ("state",)]
        assert nobody.list_tables("state") == []
        with pytest.raises(ForbiddenError):
            nobody.load_table(("state", "prices"))

        con = duckdb_catalog(running, READER_TOKEN)
        assert duckdb_tables(con) == [("state", "prices")]
        assert duckdb_rows(con, "prices") == expected["prices"]
        with pytest.raises(duckdb.Error, match="secret"):
            duckdb_rows(con, "secret")

        # A tokens file makes a principal required: no token, or one not in the file, 401.
        with pytest.raises(UnauthorizedError):
            pyiceberg_catalog(running, None)
        with pytest.raises(UnauthorizedError):
            pyiceberg_catalog(running, "not-a-token")
        with pytest.raises(duckdb.Error, match="401"):
            duckdb_catalog(running, None)
        status, body = http("GET", f"{catalog_url(running)}/v1/namespaces/state/tables")
        assert (status, body["error"]["type"]) == (401, "NotAuthorizedException")
        log = running.log()
        assert READER_TOKEN not in log and NOBODY_TOKEN not in log


def test_anonymous_sees_what_its_acls_allow(
        data: tuple[Path, dict[str, list[StateRow]]]) -> None:
    """The authorizer on and no tokens file: a client without a token is
    User:ANONYMOUS, which may DESCRIBE `secret` only."""
    root, expected = data
    with server(root, authenticated=False, authorizer=True) as running:
        catalog = pyiceberg_catalog(running, None)
        assert catalog.list_tables("state") == [("state", "secret")]
        assert pyiceberg_rows(catalog, "secret") == expected["secret"]
        with pytest.raises(ForbiddenError, match="User:ANONYMOUS"):
            catalog.load_table(("state", "prices"))
        con = duckdb_catalog(running, None)
        assert duckdb_tables(con) == [("state", "secret")]
        assert duckdb_rows(con, "secret") == expected["secret"]


# -- on S3 ----------------------------------------------------------------------------------


def test_the_catalog_of_a_server_on_s3(s3: S3Server, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """A server on an s3:// data location: the catalog's metadata points at s3:// URLs,
    and the engines read them with their own S3 settings (the catalog vends none)."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    where = str(s3.location("catalog"))
    with LogStore.open(where, local_dir=tmp_path / "writer") as store:
        store.create_topic("prices", 2, CONFIG)
        produce(store, updates(0, 300, 40, tombstone_every=9))
        compact(store)
        expected = expected_state(store)
    env = {**s3.env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "server-local")}
    with logged_server(where, tmp_path / "server.log", "--admin-listen", "127.0.0.1:0",
                       env=env) as running:
        catalog = load_catalog("c", type="rest", uri=catalog_url(running),
                               auth={"type": "noop"}, **pyiceberg_properties(s3))
        table = catalog.load_table(("state", "prices"))
        assert table.metadata_location.startswith(f"{where}/topics/prices/")
        found = table.scan().to_arrow().select(COLUMNS).to_pylist()
        assert sorted(_row(**row) for row in found) == expected

        con = duckdb_on_s3(s3)
        con.execute(f"ATTACH 'compactlog' AS c (TYPE iceberg, "
                    f"ENDPOINT '{catalog_url(running)}', AUTHORIZATION_TYPE 'none')")
        assert duckdb_rows(con, "prices") == expected


def test_the_raw_namespace_serves_the_raw_tables(tmp_path: Path) -> None:
    """Namespace `raw`: a topic with iceberg.raw.enabled, its sealed log read through the
    catalog by pyiceberg and DuckDB, tombstones included; a topic without it has none."""
    from compactlog.iceberg import state_table_location, sync_raw_table
    from support.iceberg_raw import raw_rows

    with LogStore.open(tmp_path / "data") as store:
        store.create_topic("events", 2, {"iceberg.raw.enabled": "true"})
        store.create_topic("quiet", 1, {})
        store.append("events", updates(0, 200, 30, tombstone_every=7))
        for partition in store.topic("events").partitions:
            partition.roll()
        sync_raw_table(store, "events")
        expected = raw_rows(store, "events")
    assert len(expected) == 200 and any(row[3] is None for row in expected)
    with server(tmp_path, authenticated=False) as running:
        catalog = pyiceberg_catalog(running, None)
        assert catalog.list_tables("raw") == [("raw", "events")]
        assert catalog.list_tables("state") == []
        rows = catalog.load_table(("raw", "events")).scan().to_arrow().select(COLUMNS)
        assert sorted(_row(**row) for row in rows.to_pylist()) == expected
        with pytest.raises(NoSuchTableError, match=r"iceberg\.raw\.enabled"):
            catalog.load_table(("raw", "quiet"))
        con = duckdb_catalog(running, None)
        found = con.execute('SELECT partition, "offset", key, value, headers '
                            "FROM c.raw.events").fetchall()
        assert sorted(_row(*row) for row in found) == expected
    # Switched off, the server's upkeep drops the table (iceberg/drop.py): not listed,
    # its files and holds gone.
    with LogStore.open(tmp_path / "data") as store:
        store.alter_topic("events", {"iceberg.raw.enabled": "false"})
        folder = Path(state_table_location(store, "events", "raw"))
        partitions = store.topic("events").partitions
        holds = [partition.holds for partition in partitions]
    with server(tmp_path, authenticated=False) as running:
        catalog = pyiceberg_catalog(running, None)
        assert catalog.list_tables("raw") == []
        deadline = time.monotonic() + 30
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not folder.exists(), running.log_path.read_text()[-2000:]
    assert not any(hold.has("iceberg-raw") for hold in holds)
