"""No log line of the server's is a client's: control characters in a message are
escaped before it is written.

Names a client chooses (topics it asks for, group ids, client ids, SASL mechanisms)
reach log messages. A newline in one would start a line of the client's making, a
forged "authenticated User:root" say, and an escape sequence would drive the operator's
terminal. The filter that `install` puts on every handler of the root logger rewrites
each record's message once it is formatted: C0 and C1 control characters, DEL and the
Unicode line and paragraph separators become Python escapes (`\\n`, `\\x1b`,
`\\u2028`). A traceback is not part of the message and stays as it is.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape(text: str) -> str:
    """`text` with its control characters written as Python escapes."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


class EscapeControl(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: let the handler report it as usual
            return True
        if _CONTROL.search(message):
            record.msg, record.args = escape(message), None
        return True


_FILTER = EscapeControl()


def install() -> None:
    """Put the filter on every handler of the root logger (once each)."""
    for handler in logging.getLogger().handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
