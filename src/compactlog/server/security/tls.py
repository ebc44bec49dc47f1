"""TLS for the Kafka listeners and the admin API: certificate and key as PEM files, an
optional CA for client certificates (Kafka's ssl.client.auth), reload on SIGHUP.

Invariants:
- Every handshake negotiates TLS 1.2 or newer.
- A reload either takes effect whole (certificate, key and CA read and checked
  together) or changes nothing and says why; connections already open keep their
  session. New handshakes use the newest certificate: the listening socket's context
  never changes, and its servername callback (called by OpenSSL on every handshake,
  with or without SNI) hands each new connection the newest context.
- A reload never blocks the event loop: it runs on a thread of its own, one at a time,
  and refuses a path that is not a regular file (a FIFO there would make open() wait
  for a writer for ever), so a hostile or broken file leaves every listener serving.
- With client_auth "required", a client without a certificate signed by the CA (an
  expired one, another CA's) does not complete the handshake; with "requested" it may
  send none and is User:ANONYMOUS, as in Kafka.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from compactlog.errors import UserError

log = logging.getLogger("compactlog.server")
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    client_auth: str = "none"  # none | requested | required (Kafka's ssl.client.auth)
    key_password: str | None = None

    def check(self) -> None:
        if self.client_auth not in CLIENT_AUTH:
            raise UserError(f"tls.client_auth must be one of {', '.join(CLIENT_AUTH)}, "
                            f"got {self.client_auth!r}")
        if self.client_auth != "none" and self.ca_file is None:
            raise UserError(f"tls.client_auth = {self.client_auth!r} needs tls.ca_file, the "
                            f"CA that signs client certificates")


def _check_regular(settings: TlsSettings) -> None:
    """UserError for a path that exists and is not a regular file (a FIFO, a device):
    OpenSSL would block opening or reading it."""
    for path in (settings.cert_file, settings.key_file, settings.ca_file):
        if path is None:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # missing or unreadable: loading says so
        if not stat.S_ISREG(mode):
            raise UserError(f"TLS: {path} is not a regular file")


def _context(settings: TlsSettings) -> ssl.SSLContext:
    _check_regular(settings)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = CLIENT_AUTH[settings.client_auth]
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file, settings.key_password)
        if settings.ca_file is not None:
            context.load_verify_locations(cafile=settings.ca_file)
    except (OSError, ssl.SSLError) as error:
        raise UserError(f"TLS: cannot load the certificate {settings.cert_file}, key "
                        f"{settings.key_file}"
                        f"{f' or CA {settings.ca_file}' if settings.ca_file else ''}: "
                        f"{error}") from None
    return context


class ServerTls:
    """The server side of TLS, shared by every TLS listener and the admin API."""

    def __init__(self, settings: TlsSettings) -> None:
        settings.check()
        self.settings = settings
        self._newest = _context(settings)
        # The listening context: its verify mode and minimum version apply to every
        # connection; the certificates come from the newest context (_pick).
        self.context = _context(settings)
        self.context.sni_callback = self._pick
        self.reloads = 0
        self._reloading: threading.Thread | None = None

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
              context: ssl.SSLContext) -> None:
        connection.context = self._newest

    def reload_in_background(self) -> None:
        """SIGHUP: `reload` on a daemon thread of its own, so that no file read (a slow
        disk, whatever sits at the paths) holds the event loop or the shutdown; one at
        a time."""
        if self._reloading is not None and self._reloading.is_alive():
            log.warning("TLS reload asked for while the one before is still reading the "
                        "files; ignored")
            return
        self._reloading = threading.Thread(target=self.reload, name="compactlog-tls-reload",
                                           daemon=True)
        self._reloading.start()

    def reload(self) -> bool:
        """Read the files again; True if the new ones are in use."""
        try:
            fresh = _context(self.settings)
        except UserError as error:
            log.error("TLS reload failed, keeping the certificate in use: %s", error)
            return False
        self._newest = fresh
        self.reloads += 1
        log.info("TLS certificate reloaded from %s (new connections use it)",
                 self.settings.cert_file)
        return True


def certificate_principal(der: bytes | None) -> str | None:
    """Kafka's default SSL principal: "User:" and the subject as an RFC 2253 name, most
    specific part first (CN=alice,O=acme); None without a certificate."""
    if not der:
        return None
    subject = x509.load_der_x509_certificate(der).subject
    return "User:" + subject.rfc4514_string()
