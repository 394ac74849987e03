"""Plain, picklable settings for S3 storage, parsed from keyword options and the environment.

Everything a Spark executor needs to build its own S3 client travels in :class:`S3Settings`:
no boto3 object is ever pickled. Credentials are optional here; when absent, boto3's own
chain (environment, profile, instance or container role) resolves them where the client is
built. Given explicitly, they travel with the settings but never appear in ``repr`` or in
error messages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Final, Literal
from urllib.parse import urlparse

from state_runtime.errors import InvalidArgument
from state_runtime.redaction import register_secret

ENV_ENDPOINT_URL: Final = "STATE_S3_ENDPOINT_URL"
"""The endpoint override this library reads (MinIO, moto, other S3-compatible stores)."""

AWS_ENDPOINT_ENV: Final = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
AWS_REGION_ENV: Final = ("AWS_REGION", "AWS_DEFAULT_REGION")

MIB: Final = 1024 * 1024
MIN_PART_SIZE: Final = 5 * MIB
"""S3 (and MinIO) reject multipart parts below 5 MiB, except the last one."""
MAX_PART_SIZE: Final = 5 * 1024 * MIB
RetryMode = Literal["standard", "adaptive"]
AddressingStyle = Literal["auto", "path", "virtual"]
RETRY_MODES: Final = ("standard", "adaptive")
ADDRESSING_STYLES: Final = ("auto", "path", "virtual")
SECRET_FIELDS: Final = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3 and how hard to try. Hashable, so clients can be shared per settings.

    ``max_attempts`` counts every attempt, the first included (like ``AWS_MAX_ATTEMPTS``).
    ``addressing_style`` ``None`` means path-style with an endpoint override (what MinIO
    needs) and boto3's choice otherwise.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    profile_name: str | None = None
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle | None = None
    retry_mode: RetryMode = "standard"
    max_attempts: int = 5
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_pool_connections: int = 16
    multipart_threshold: int = 64 * MIB
    multipart_part_size: int = 16 * MIB
    multipart_concurrency: int = 4

    def __post_init__(self) -> None:
        for secret in self.secrets:
            register_secret(secret)  # masked in every message from now on
        if self.endpoint_url is not None:
            _check_endpoint(self.endpoint_url)
        _check_choice("retry_mode", self.retry_mode, RETRY_MODES)
        if self.addressing_style is not None:
            _check_choice("addressing_style", self.addressing_style, ADDRESSING_STYLES)
        for name in ("max_attempts", "max_pool_connections", "multipart_concurrency"):
            _check_at_least(name, getattr(self, name), 1)
        _check_at_least("multipart_threshold", self.multipart_threshold, 1)
        _check_at_least("multipart_part_size", self.multipart_part_size, MIN_PART_SIZE)
        if self.multipart_part_size > MAX_PART_SIZE:
            raise InvalidArgument(f"invalid S3 option multipart_part_size: above {MAX_PART_SIZE}")
        for name in ("connect_timeout", "read_timeout"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"invalid S3 option {name}: must be positive")

    @classmethod
    def resolve(
        cls, options: Mapping[str, object], environ: Mapping[str, str] | None = None
    ) -> S3Settings:
        """Settings from keyword options (strings accepted, as from Spark conf) and the env.

        The endpoint comes from ``endpoint_url``, else ``STATE_S3_ENDPOINT_URL``, else boto3's
        ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``; the region from ``region_name``, else
        ``AWS_REGION`` / ``AWS_DEFAULT_REGION``. Both are resolved here, on the driver, so
        executors use the same even when their environment differs.
        """
        env = os.environ if environ is None else environ
        unknown = sorted(set(options) - set(_CONVERTERS))
        if unknown:
            raise InvalidArgument(
                f"unknown S3 option(s) {', '.join(unknown)}; known: {', '.join(_CONVERTERS)}"
            )
        values = {name: _convert(name, value) for name, value in options.items()}
        if values.get("endpoint_url") is None:
            values["endpoint_url"] = _first_env(env, (ENV_ENDPOINT_URL, *AWS_ENDPOINT_ENV))
        if values.get("region_name") is None:
            values["region_name"] = _first_env(env, AWS_REGION_ENV)
        return cls(**values)  # type: ignore[arg-type]

    def client_settings(self) -> S3Settings:
        """These settings without the upload tuning, which does not shape the client."""
        defaults = S3Settings()
        return replace(
            self,
            multipart_threshold=defaults.multipart_threshold,
            multipart_part_size=defaults.multipart_part_size,
            multipart_concurrency=defaults.multipart_concurrency,
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """The credential strings that must never be shown."""
        return tuple(v for v in (getattr(self, n) for n in SECRET_FIELDS) if v)

    @property
    def effective_addressing_style(self) -> AddressingStyle:
        if self.addressing_style is not None:
            return self.addressing_style
        return "path" if self.endpoint_url else "auto"


def _first_env(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)


def _check_endpoint(url: str) -> None:
    parsed = urlparse(url)
    if parsed.username or parsed.password or "@" in parsed.netloc:
        # Never echo the URL: it carries a credential.
        raise InvalidArgument("invalid S3 endpoint_url: must not contain credentials")
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        raise InvalidArgument(f"invalid S3 endpoint_url {url!r}: expected http(s)://host[:port]")
    if parsed.path not in {"", "/"} or parsed.query or parsed.fragment:
        raise InvalidArgument(f"invalid S3 endpoint_url {url!r}: no path or query allowed")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgument(f"invalid S3 option {name}={value!r}: one of {', '.join(choices)}")


def _check_at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise InvalidArgument(f"invalid S3 option {name}={value!r}: must be at least {low}")


def _optional_str(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError("expected an integer")
    return int(value)


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError("expected a number")
    return float(value)


_CONVERTERS: Final[dict[str, Callable[[object], object]]] = {
    f.name: (
        _optional_str
        if f.default is None
        else {str: _str, int: _int, float: _float}[type(f.default)]
    )
    for f in fields(S3Settings)
}


def _convert(name: str, value: object) -> object:
    try:
        return _CONVERTERS[name](value)
    except (TypeError, ValueError) as e:
        shown = "<hidden>" if name in SECRET_FIELDS else repr(value)
        raise InvalidArgument(f"invalid S3 option {name}={shown}: {e}") from None
