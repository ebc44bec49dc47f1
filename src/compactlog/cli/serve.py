"""`compactlog serve`: the Kafka-protocol server."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import click

from compactlog.cli import Context
from compactlog.errors import UserError
from compactlog.server.app import ServerConfig, serve_forever
from compactlog.server.authorizer import AuthorizationConfig
from compactlog.server.cleaner import CleanerConfig

# The server's settings file (TOML), every key optional:
#
#   listen = "127.0.0.1:9092"        # host:port of the Kafka listener
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
#   upkeep_interval_s = 1.0          # flush.ms / segment.ms / retention checks, manifest pickup
#   group_initial_rebalance_delay_s = 3.0  # a new group waits this long for more members
#   shutdown_grace_s = 5.0           # on SIGTERM, time for requests in flight to be answered
#
#   [compaction]                     # automatic compaction (docs/server.md)
#   enabled = true                   # the server compacts due partitions on its own
#   check_interval_s = 15.0          # how often partitions are measured
#   threshold_bytes = 0              # dirty bytes that make a partition due (0: off)
#   max_concurrent_runs = 1          # compaction processes at once
#   backoff_initial_s = 30.0         # first wait after a partition's run fails; doubles
#   backoff_max_s = 1800.0           # ... up to this
#   io_max_bytes_per_s = 0           # average compaction read rate (0: unlimited)
#   run_timeout_s = 3600.0           # a run going longer is stopped
#   keep_warm_s = 300.0              # keep a compaction process (Spark) warm this long; 0: off
#   spark_master = "local[*]"        # where compaction runs
#   spark_conf = { "spark.driver.memory" = "2g" }   # Spark settings, passed through
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
SETTINGS: dict[str, type] = {"listen": str, "admin_listen": str, "max_connections": int,
                             "max_connections_per_ip": int, "max_open_data_files": int,
                             "connections_max_idle_s": float,
                             "max_request_bytes": int, "queued_max_request_bytes": int,
                             "upkeep_interval_s": float,
                             "group_initial_rebalance_delay_s": float,
                             "shutdown_grace_s": float, "compaction": dict,
                             "authorization": dict}
COMPACTION_SETTINGS: dict[str, type] = {
    "enabled": bool, "check_interval_s": float, "threshold_bytes": int,
    "max_concurrent_runs": int, "backoff_initial_s": float, "backoff_max_s": float,
    "io_max_bytes_per_s": float, "run_timeout_s": float, "keep_warm_s": float,
    "spark_master": str,
    "spark_conf": dict, "service": str, "allowed_strategy_functions": list,
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
    return raw


@click.command()
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Where the Kafka listener binds. Default 127.0.0.1:9092; port 0 picks a "
                   "free port (printed at start).")
@click.option("--admin-listen", default=None, metavar="HOST:PORT",
              help="Serve the admin API and Prometheus /metrics over HTTP here (off by "
                   "default); port 0 picks a free port (printed at start).")
@click.option("--auto-compaction/--no-auto-compaction", default=None,
              help="Compact due partitions automatically (default: on, or the config "
                   "file's compaction.enabled).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A TOML file of server settings (see docs/server.md).")
@click.pass_obj
def serve(ctx: Context, listen: str | None, admin_listen: str | None,
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
      compactlog --data-dir /var/lib/compactlog serve --listen 0.0.0.0:9092 \\
          --config /etc/compactlog/server.toml
      kcat -b 127.0.0.1:9092 -t prices -P -K: <<< 'AAPL:189.5'
      curl -s 127.0.0.1:9093/metrics | grep compactlog_compaction
    """
    settings = load_settings(config_file) if config_file else {}
    host, port = parse_listen(listen or settings.get("listen", "127.0.0.1:9092"))
    config = ServerConfig(ctx.data_dir, host, port)
    config.authorization = AuthorizationConfig(**settings.get("authorization", {}))
    for key in SETTINGS:
        if key not in ("listen", "admin_listen", "compaction", "authorization") and (
                key in settings):
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
    asyncio.run(serve_forever(config))
