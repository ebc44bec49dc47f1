"""`compactlog serve`: the Kafka-protocol server."""

from __future__ import annotations

import asyncio
import errno
import re
import tomllib
from pathlib import Path
from typing import Any

import click

from compactlog.cli import Context
from compactlog.errors import UserError
from compactlog.server.app import serve_forever
from compactlog.server.cleaner import CleanerConfig
from compactlog.server.network.listeners import Listener, parse_listener
from compactlog.server.security.authorizer import AuthorizationConfig
from compactlog.server.security.tls import TlsSettings
from compactlog.server.server_config import ServerConfig

# The server's settings file (TOML), every key optional:
#
#   listen = "127.0.0.1:9092"        # host:port of the PLAINTEXT Kafka listener; with
#                                    # `listeners` set, only if set here or by --listen
#   listeners = []                   # more Kafka listeners, NAME://HOST:PORT as Kafka's
#                                    # `listeners`: e.g. ["SASL_SSL://0.0.0.0:9094"]; NAME
#                                    # is a security protocol (PLAINTEXT, SSL,
#                                    # SASL_PLAINTEXT, SASL_SSL) or any name given one in
#                                    # [listener.NAME]; port 0 picks a free port
#   admin_tls = false                # serve the admin API over HTTPS with [tls]
#   sasl_failure_delay_s = 0.1       # a repeated failed SASL login from one address is
#   sasl_failure_delay_max_s = 5.0   # answered after this, doubling per failure up to this
#   admin_listen = "127.0.0.1:9093"  # host:port of the admin and metrics HTTP listener (off
#                                    # unless set here or by --admin-listen)
#   # Resource limits (docs/server.md, "Resource limits"); Kafka's names in brackets.
#   max_connections = 4096           # connections at once, capped by the open-file limit
#   max_connections_per_ip = 1024    # ... from one address [max.connections.per.ip]
#   max_open_data_files = 128        # Parquet files held open at once, capped to a quarter
#                                    # of the open-file limit
#   connections_max_idle_s = 600.0   # close connections silent this long
#                                    # [connections.max.idle.ms]
#   max_request_bytes = 104857600    # larger requests close the connection
#                                    # [socket.request.max.bytes]
#   queued_max_request_bytes = 268435456  # request bytes in flight, all connections; past
#                                    # it reads pause [queued.max.request.bytes];
#                                    # at least max_request_bytes
#   queued_max_unauthenticated_bytes = 8388608  # per SASL listener: bytes of frames
#                                    # over 64 KiB from clients not yet authenticated
#   max_uncompressed_batch_bytes = 33554432  # a compressed produce batch decompressing
#                                    # to more is refused [MESSAGE_TOO_LARGE]
#   fetch_max_bytes = 57671680       # the most records one Fetch response holds
#                                    # [fetch.max.bytes]
#   upkeep_interval_s = 1.0          # flush.ms / segment.ms / retention checks, manifest pickup
#   group_initial_rebalance_delay_s = 3.0  # a new group waits this long for more members
#   group_min_session_timeout_s = 6.0     # JoinGroup session timeouts outside these get
#   group_max_session_timeout_s = 1800.0  # INVALID_SESSION_TIMEOUT
#                                    # [group.min/max.session.timeout.ms]
#   max_groups = 100000              # consumer groups held, and member ids handed out and
#                                    # not used yet; past it: COORDINATOR_NOT_AVAILABLE
#   shutdown_grace_s = 5.0           # on SIGTERM, time for requests in flight to be answered
#
#   [compaction]                     # automatic compaction (docs/server.md)
#   enabled = true                   # the server compacts due partitions on its own
#   check_interval_s = 15.0          # how often partitions are measured
#   threshold_bytes = 0              # dirty bytes that make a partition due (0: off)
#   max_concurrent_runs = 1          # compaction processes at once
#   backoff_initial_s = 30.0         # first wait after a partition's run fails; doubles
#   backoff_max_s = 1800.0           # ... up to this
#   io_max_bytes_per_s = 0           # compaction bytes read+written per second (0: unlimited)
#   run_timeout_s = 3600.0           # a run going longer is stopped
#   keep_warm_s = 300.0              # keep a compaction process (Spark) warm this long; 0: off
#   spark_master = "local[*]"        # where compaction runs (default: spark.master in
#                                    # your spark-defaults.conf, else local[*])
#   spark_conf = { "spark.driver.memory" = "2g" }   # Spark settings, passed through
#   without_spark = false            # true: run every topic's compaction tasks in the
#                                    # compaction process, no Spark job, no JVM (for tests
#                                    # and embedded use; compaction.without.spark per topic)
#   service = "module:factory"       # compaction service factory (default: Spark)
#   allowed_strategy_functions = []  # "MODULE:NAME"s that clients may name in a topic's
#                                    # compaction.strategy as function:MODULE:NAME
#
#   [authorization]                  # ACLs (docs/server.md, "Authorization")
#   enabled = false                  # check ACLs; off: every request is allowed
#   super_users = []                 # e.g. ["User:admin"] [super.users]
#   allow_everyone_if_no_acl_found = false  # a resource no ACL names is open
#                                    # [allow.everyone.if.no.acl.found]
#   admin_tokens_file = "/etc/compactlog/admin-tokens"  # admin API bearer tokens
#   admin_open_health_and_metrics = true  # /metrics and /v1/health need no token
#
#   [tls]                            # for SSL and SASL_SSL listeners (docs/server.md, Security)
#   cert_file = "server.pem"         # the server's certificate chain, PEM [ssl.keystore]
#   key_file = "server.key"          # its private key, PEM
#   key_password = ""                # the key's password, if encrypted
#   ca_file = "ca.pem"               # CA of client certificates [ssl.truststore]; unset: none
#   client_auth = "none"             # none | requested | required [ssl.client.auth]
#
#   [listener.SASL_SSL]              # per listener, by name
#   security_protocol = "SASL_SSL"   # needed when the name is not a protocol's
#   sasl_mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]  # enabled mechanisms
#                                    # [sasl.enabled.mechanisms]; default: all three
#   advertised = "host:port"         # what Metadata tells clients [advertised.listeners];
#                                    # default: the bound address
SETTINGS: dict[str, type] = {"listen": str, "admin_listen": str, "max_connections": int,
                             "max_connections_per_ip": int, "max_open_data_files": int,
                             "connections_max_idle_s": float,
                             "max_request_bytes": int, "queued_max_request_bytes": int,
                             "queued_max_unauthenticated_bytes": int,
                             "max_uncompressed_batch_bytes": int, "fetch_max_bytes": int,
                             "upkeep_interval_s": float,
                             "group_initial_rebalance_delay_s": float,
                             "group_min_session_timeout_s": float,
                             "group_max_session_timeout_s": float,
                             "max_groups": int,
                             "shutdown_grace_s": float, "compaction": dict,
                             "listeners": list, "admin_tls": bool, "tls": dict,
                             "listener": dict, "sasl_failure_delay_s": float,
                             "sasl_failure_delay_max_s": float,
                             "authorization": dict, "lease_ttl_s": float,
                             "ack_after_upload": bool, "upload_interval_s": float}
TLS_SETTINGS: dict[str, type] = {"cert_file": str, "key_file": str, "key_password": str,
                                 "ca_file": str, "client_auth": str}
LISTENER_SETTINGS: dict[str, type] = {"security_protocol": str, "sasl_mechanisms": list,
                                      "advertised": str}
COMPACTION_SETTINGS: dict[str, type] = {
    "enabled": bool, "check_interval_s": float, "threshold_bytes": int,
    "max_concurrent_runs": int, "backoff_initial_s": float, "backoff_max_s": float,
    "io_max_bytes_per_s": float, "run_timeout_s": float, "keep_warm_s": float,
    "spark_master": str,
    "spark_conf": dict, "service": str, "allowed_strategy_functions": list,
    "without_spark": bool,
}
AUTHORIZATION_SETTINGS: dict[str, type] = {
    "enabled": bool, "super_users": list, "allow_everyone_if_no_acl_found": bool,
    "admin_tokens_file": str, "admin_open_health_and_metrics": bool,
}


def parse_listen(text: str, option: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"{option} wants HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def _checked(path: Path, where: str, raw: dict[str, Any],
             wanted_types: dict[str, type]) -> dict[str, Any]:
    for key, value in raw.items():
        wanted = wanted_types.get(key)
        if wanted is None:
            raise UserError(f"{path}: unknown setting {where}{key!r}; known: "
                            f"{', '.join(wanted_types)}")
        if wanted is float and isinstance(value, int) and not isinstance(value, bool):
            raw[key] = value = float(value)
        if not isinstance(value, wanted) or (isinstance(value, bool) and wanted is not bool):
            raise UserError(f"{path}: {where}{key} must be a {wanted.__name__}, got {value!r}")
    return raw


def _strings(path: Path, where: str, value: list[Any]) -> None:
    if not all(isinstance(item, str) for item in value):
        raise UserError(f"{path}: {where} must be a list of strings, got {value!r}")


def load_settings(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"server config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"server config file {path} is not valid TOML: {error}") from None
    _checked(path, "", raw, SETTINGS)
    if "compaction" in raw:
        _checked(path, "compaction.", raw["compaction"], COMPACTION_SETTINGS)
        conf = raw["compaction"].get("spark_conf", {})
        if not all(isinstance(v, str | int | float | bool) for v in conf.values()):
            raise UserError(f"{path}: compaction.spark_conf values must be strings or numbers")
        raw["compaction"]["spark_conf"] = {k: str(v).lower() if isinstance(v, bool) else str(v)
                                           for k, v in conf.items()}
        _strings(path, "compaction.allowed_strategy_functions",
                 raw["compaction"].get("allowed_strategy_functions", []))
    if "authorization" in raw:
        _checked(path, "authorization.", raw["authorization"], AUTHORIZATION_SETTINGS)
        _strings(path, "authorization.super_users",
                 raw["authorization"].get("super_users", []))
    if "tls" in raw:
        _checked(path, "tls.", raw["tls"], TLS_SETTINGS)
    for name, table in raw.get("listener", {}).items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: listener.{name} must be a table")
        _checked(path, f"listener.{name}.", table, LISTENER_SETTINGS)
    return raw


def build_listeners(settings: dict[str, Any], listen: str | None,
                    extra: tuple[str, ...]) -> list[Listener]:
    """The Kafka listeners: the PLAINTEXT `listen` one (when set, or when nothing else
    is), then `listeners` from the file and --listener, with [listener.NAME] applied."""
    tables: dict[str, dict[str, Any]] = settings.get("listener", {})
    protocols = {name: str(table["security_protocol"]) for name, table in tables.items()
                 if "security_protocol" in table}
    texts = [*settings.get("listeners", []), *extra]
    listen = listen or settings.get("listen")
    result: list[Listener] = []
    if listen is not None or not texts:
        host, port = parse_listen(listen or "127.0.0.1:9092")
        result.append(Listener("PLAINTEXT", "PLAINTEXT", host, port))
    for text in texts:
        if not isinstance(text, str):
            raise UserError(f"listeners wants strings NAME://HOST:PORT, got {text!r}")
        result.append(parse_listener(text, protocols))
    for listener in result:
        table = tables.get(listener.name, {})
        if "sasl_mechanisms" in table:
            listener.sasl_mechanisms = tuple(str(m) for m in table["sasl_mechanisms"])
        if "advertised" in table:
            host, port = parse_listen(str(table["advertised"]),
                                      f"listener.{listener.name}.advertised")
            listener.advertised_host, listener.advertised_port = host, port
    return result


def build_tls(settings: dict[str, Any], cert: Path | None, key: Path | None,
              ca: Path | None, client_auth: str | None) -> TlsSettings | None:
    table: dict[str, Any] = dict(settings.get("tls", {}))
    for name, value in (("cert_file", cert), ("key_file", key), ("ca_file", ca),
                        ("client_auth", client_auth)):
        if value is not None:
            table[name] = str(value)
    if not table:
        return None
    if "cert_file" not in table or "key_file" not in table:
        raise UserError("TLS needs both a certificate and a key (tls.cert_file and "
                        "tls.key_file, or --tls-cert and --tls-key)")
    return TlsSettings(Path(table["cert_file"]), Path(table["key_file"]),
                       Path(table["ca_file"]) if table.get("ca_file") else None,
                       table.get("client_auth", "none"), table.get("key_password") or None)


@click.command()
@click.option("--listen", default=None, metavar="HOST:PORT", envvar="COMPACTLOG_LISTEN",
              help="Where the Kafka listener binds (or COMPACTLOG_LISTEN). Default "
                   "127.0.0.1:9092; port 0 picks a free port (printed at start).")
@click.option("--listener", "listeners", multiple=True, metavar="NAME://HOST:PORT",
              help="A Kafka listener as in Kafka's `listeners`, e.g. "
                   "SASL_SSL://0.0.0.0:9094 (repeat for more). With listeners, the "
                   "PLAINTEXT --listen one is served only if --listen or `listen` is set.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM certificate (chain) of SSL and SASL_SSL listeners (tls.cert_file).")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM private key of --tls-cert (tls.key_file).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM CA that signs client certificates (tls.ca_file).")
@click.option("--tls-client-auth", type=click.Choice(["none", "requested", "required"]),
              default=None, help="Client certificates, as Kafka's ssl.client.auth "
                                 "(tls.client_auth; default none).")
@click.option("--admin-listen", default=None, metavar="HOST:PORT",
              help="Serve the admin API and Prometheus /metrics over HTTP here (off by "
                   "default); port 0 picks a free port (printed at start).")
@click.option("--auto-compaction/--no-auto-compaction", default=None,
              help="Compact due partitions automatically (default: on, or the config "
                   "file's compaction.enabled).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A TOML file of server settings (see docs/server.md).")
@click.pass_obj
def serve(ctx: Context, listen: str | None, listeners: tuple[str, ...],
          tls_cert: Path | None, tls_key: Path | None, tls_ca: Path | None,
          tls_client_auth: str | None, admin_listen: str | None,
          auto_compaction: bool | None, config_file: Path | None) -> None:
    """Serve the data directory over the Kafka wire protocol.

    Kafka clients (kafka-python, aiokafka, confluent-kafka/librdkafka, kcat) produce and
    consume unchanged. Compacted topics read as in Kafka: from offset 0 a consumer gets
    the compacted view, then the live log. The server compacts due partitions itself,
    each run in a Spark process of its own; a compaction committed by
    `compactlog compact` on the same data directory is picked up without a restart.
    SIGTERM or SIGINT stops the server after making everything acknowledged durable.

    \b
    Examples:
      compactlog serve
      compactlog serve --admin-listen 127.0.0.1:9093
      compactlog serve --listener SASL_SSL://0.0.0.0:9094 --tls-cert server.pem \\
          --tls-key server.key
      compactlog --data-dir /var/lib/compactlog serve --listen 0.0.0.0:9092 \\
          --config /etc/compactlog/server.toml
      kcat -b 127.0.0.1:9092 -t prices -P -K: -X partitioner=murmur2_random \\
          <<< 'AAPL:189.5'
      curl -s 127.0.0.1:9093/metrics | grep compactlog_compaction
    """
    settings = load_settings(config_file) if config_file else {}
    try:
        kafka_listeners = build_listeners(settings, listen, listeners)
        tls = build_tls(settings, tls_cert, tls_key, tls_ca, tls_client_auth)
    except UserError as error:
        raise UserError(f"{config_file}: {error}" if config_file else str(error)) from None
    first = kafka_listeners[0]
    config = ServerConfig(ctx.data_dir, first.host, first.port, listeners=kafka_listeners,
                          tls=tls)
    config.data_location = str(ctx.location) if ctx.location.is_s3 else None
    config.authorization = AuthorizationConfig(**settings.get("authorization", {}))
    for key in SETTINGS:
        if key not in ("listen", "admin_listen", "compaction", "listeners", "listener",
                       "tls", "authorization") and key in settings:
            setattr(config, key, settings[key])
    admin = admin_listen or settings.get("admin_listen")
    if admin:
        config.admin_host, config.admin_port = parse_listen(admin, "--admin-listen")
    try:
        config.check()
    except UserError as error:
        raise UserError(f"{config_file}: {error}" if config_file else str(error)) from None
    config.compaction = CleanerConfig(**settings.get("compaction", {}))
    if auto_compaction is not None:
        config.compaction.enabled = auto_compaction
    try:
        asyncio.run(serve_forever(config))
    except OSError as error:
        raise _listen_error(error, config) from error
    # SIGTERM or SIGINT, after the shutdown: everything acknowledged is durable.
    click.echo("compactlog stopped", nl=True)


BIND_ERRORS = {errno.EADDRINUSE: "the address is already in use (another server?)",
               errno.EADDRNOTAVAIL: "this machine has no such address",
               errno.EACCES: "permission denied (a port below 1024 needs privileges)"}


def _listen_error(error: OSError, config: ServerConfig) -> Exception:
    """A listener that could not bind, as one line naming its address; other OS errors
    are passed on."""
    if error.errno not in BIND_ERRORS:
        return error
    # asyncio's message: "error while attempting to bind on address ('HOST', PORT): ..."
    found = re.search(r"address \('([^']*)', (\d+)", str(error))
    if found is not None:
        address = f"{found.group(1)}:{found.group(2)}"
    else:
        address = " or ".join(f"{listener.host}:{listener.port}"
                              for listener in config.listeners)
    return UserError(f"cannot listen on {address}: {BIND_ERRORS[error.errno]}; choose "
                     "another with --listen / --admin-listen HOST:PORT (port 0: any free "
                     "port)")
