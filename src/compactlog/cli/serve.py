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

# The server's settings file (TOML), every key optional:
#
#   listen = "127.0.0.1:9092"        # host:port of the Kafka listener
#   max_request_bytes = 104857600    # larger requests close the connection (Kafka's default)
#   upkeep_interval_s = 1.0          # flush.ms / segment.ms / retention checks, manifest pickup
#   group_initial_rebalance_delay_s = 3.0  # a new group waits this long for more members
#   shutdown_grace_s = 5.0           # on SIGTERM, time for requests in flight to be answered
SETTINGS: dict[str, type] = {"listen": str, "max_request_bytes": int,
                             "upkeep_interval_s": float,
                             "group_initial_rebalance_delay_s": float,
                             "shutdown_grace_s": float}


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--listen wants HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def load_settings(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"server config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"server config file {path} is not valid TOML: {error}") from None
    for key, value in raw.items():
        wanted = SETTINGS.get(key)
        if wanted is None:
            raise UserError(f"{path}: unknown setting {key!r}; known: {', '.join(SETTINGS)}")
        if wanted is float and isinstance(value, int):
            raw[key] = value = float(value)
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise UserError(f"{path}: {key} must be a {wanted.__name__}, got {value!r}")
    return raw


@click.command()
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Where the Kafka listener binds. Default 127.0.0.1:9092; port 0 picks a "
                   "free port (printed at start).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A TOML file of server settings (listen, max_request_bytes, "
                                 "upkeep_interval_s).")
@click.pass_obj
def serve(ctx: Context, listen: str | None, config_file: Path | None) -> None:
    """Serve the data directory over the Kafka wire protocol.

    Kafka clients (kafka-python, aiokafka, confluent-kafka/librdkafka, kcat) produce and
    consume unchanged. Compacted topics read as in Kafka: from offset 0 a consumer gets
    the compacted view, then the live log. A compaction committed by
    `compactlog compact` on the same data directory is picked up without a restart.
    SIGTERM or SIGINT stops the server after making everything acknowledged durable.

    \b
    Examples:
      compactlog serve
      compactlog --data-dir /var/lib/compactlog serve --listen 0.0.0.0:9092
      kcat -b 127.0.0.1:9092 -t prices -P -K: <<< 'AAPL:189.5'
    """
    settings = load_settings(config_file) if config_file else {}
    host, port = parse_listen(listen or settings.get("listen", "127.0.0.1:9092"))
    config = ServerConfig(ctx.data_dir, host, port)
    for key in SETTINGS:
        if key != "listen" and key in settings:
            setattr(config, key, settings[key])
    asyncio.run(serve_forever(config))
