"""Listeners, as Kafka's `listeners`: `NAME://HOST:PORT`, each with a security protocol.

Invariants:
- Listener names are unique, and each has one of Kafka's four security protocols:
  PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL. A name that is a protocol's name has that
  protocol, as in Kafka's default listener.security.protocol.map; any other name needs
  its protocol set explicitly.
- A SASL listener has at least one enabled mechanism, and only known ones; an SSL or
  SASL_SSL listener needs the server's TLS settings.
- A request is handled in the context of the listener its connection came in on
  (`current`), so Metadata, FindCoordinator and DescribeCluster advertise the address
  the client reached, as Kafka advertises the listener of the request.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field

from compactlog.errors import UserError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_NAME = re.compile(r"[A-Za-z0-9_]+")  # matched whole: no final newline


@dataclass
class Listener:
    name: str
    protocol: str
    host: str
    port: int  # 0 until bound, when asked for an ephemeral port
    sasl_mechanisms: tuple[str, ...] = SASL_MECHANISMS
    # Where clients are told to connect (Kafka's advertised.listeners); None: host:port.
    advertised_host: str | None = None
    advertised_port: int | None = None
    bound_port: int = field(default=0)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def advertised(self) -> tuple[str, int]:
        from compactlog.server.info import reachable_host

        return (self.advertised_host or reachable_host(self.host),
                self.advertised_port or self.bound_port or self.port)

    def check(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise UserError(f"listener name {self.name!r} must be letters, digits or _")
        if self.protocol not in PROTOCOLS:
            raise UserError(f"listener {self.name}: unknown security protocol "
                            f"{self.protocol!r}; known: {', '.join(PROTOCOLS)}")
        if not 0 <= self.port <= 65535:
            raise UserError(f"listener {self.name}: port {self.port} is not in 0..65535")
        if self.sasl:
            if not self.sasl_mechanisms:
                raise UserError(f"listener {self.name}: a SASL listener needs at least one "
                                f"mechanism")
            for mechanism in self.sasl_mechanisms:
                if mechanism not in SASL_MECHANISMS:
                    raise UserError(f"listener {self.name}: unknown SASL mechanism "
                                    f"{mechanism!r}; known: {', '.join(SASL_MECHANISMS)}")


def parse_listener(text: str, protocols: dict[str, str] | None = None) -> Listener:
    """`NAME://HOST:PORT` (HOST may be empty for every address, or [v6]). `protocols`
    maps names that are not protocols to theirs (listener_security_protocol_map)."""
    name, sep, address = text.partition("://")
    if not sep:
        raise UserError(f"a listener is NAME://HOST:PORT, e.g. SASL_SSL://0.0.0.0:9094; "
                        f"got {text!r}")
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        raise UserError(f"listener {text!r}: the address must be HOST:PORT")
    protocol = (protocols or {}).get(name, name if name in PROTOCOLS else "")
    if not protocol:
        raise UserError(f"listener {text!r}: {name} is not a security protocol "
                        f"({', '.join(PROTOCOLS)}); name its protocol in "
                        f"[listener.{name}] security_protocol")
    listener = Listener(name, protocol, host.strip("[]") or "0.0.0.0", int(port))
    listener.check()
    return listener


def check_all(listeners: list[Listener], have_tls: bool) -> None:
    if not listeners:
        raise UserError("no listener: set listen or listeners")
    names: set[str] = set()
    for listener in listeners:
        listener.check()
        if listener.name in names:
            raise UserError(f"two listeners are named {listener.name}")
        names.add(listener.name)
        if listener.tls and not have_tls:
            raise UserError(f"listener {listener.name} ({listener.protocol}) needs TLS: set "
                            f"[tls] cert_file and key_file")


# The listener of the connection whose request is being handled (a task's context;
# Broker.run_io carries it into the I/O threads).
current: contextvars.ContextVar[Listener | None] = contextvars.ContextVar(
    "compactlog_listener", default=None)
