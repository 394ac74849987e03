"""Secrets never leave the process as text: the one place that masks them.

Every surface goes through :func:`redact`: the library's errors mask their own messages
(:class:`~state_runtime.errors.StateStoreError`), the library's loggers carry
:class:`RedactingFilter`, and the CLI and the Dagster code location print errors and
metadata built from those. It masks, wherever they appear in a text:

- the password of a URL, ``scheme://user:secret@host``, also when the secret holds an
  unescaped ``@`` (everything up to the last ``@`` before the host goes); for ``s3://``
  URLs the whole ``user:secret`` part;
- secret-looking parameters, ``?password=...``, ``&sslpassword=``, ``token=``, ``secret=``,
  ``X-Amz-Signature=`` and the like, in URLs and in libpq-style ``key=value`` strings;
- AWS access key ids (``AKIA...``, ``ASIA...``);
- every value registered with :func:`register_secret` (the catalog URL's password, explicit
  S3 credentials) and the credentials the environment holds (``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_ACCESS_KEY_ID``, ``PGPASSWORD``), raw and percent-encoded.

Values shorter than :data:`MIN_SECRET_LENGTH` are masked by the patterns only: masking every
occurrence of a two-letter string would garble every message and protect nothing.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Final
from urllib.parse import quote

MASK: Final = "***"
MIN_SECRET_LENGTH: Final = 4
SECRET_ENV: Final = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "PGPASSWORD",
)

_URL_USERINFO: Final = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<user>[^:/?#@\s'\"]*):(?P<secret>[^\s/?#'\"]*)@"
)
_S3_USERINFO: Final = re.compile(r"(?P<scheme>\bs3[an]?://)[^/?#\s'\"]*@", re.IGNORECASE)
_SECRET_PARAM: Final = re.compile(
    r"(?P<name>(?<![\w-])[\w.\-]*?"
    r"(?:password|passwd|pwd|secret|token|signature|credential|api[_-]?key|access[_-]?key)"
    r"[\w.\-]*)(?P<sep>\s*=\s*)(?P<value>'[^']*'|\"[^\"]*\"|[^\s&#,;'\"]+)",
    re.IGNORECASE,
)
_AWS_KEY_ID: Final = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")

_lock = threading.Lock()
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember ``value`` as a secret: from now on :func:`redact` masks it anywhere."""
    if not value or len(value) < MIN_SECRET_LENGTH:
        return
    with _lock:
        _registered.update({value, quote(value, safe=""), quote(value, safe="@:")})


def _known_secrets() -> list[str]:
    with _lock:
        found = set(_registered)
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= MIN_SECRET_LENGTH:
            found.update({value, quote(value, safe="")})
    return sorted(found, key=len, reverse=True)  # longest first: no partial leftovers


def redact(text: str) -> str:
    """``text`` with every secret it holds replaced by ``***``."""
    if not text:
        return text
    for secret in _known_secrets():
        text = text.replace(secret, MASK)
    text = _S3_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _SECRET_PARAM.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
    return _AWS_KEY_ID.sub(MASK, text)


class RedactingFilter(logging.Filter):
    """Masks secrets in a log record's message (arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def get_logger(name: str) -> logging.Logger:
    """The library's logger ``name``, with :class:`RedactingFilter` attached once."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
    return logger
