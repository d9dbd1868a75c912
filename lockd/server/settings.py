"""lockd's settings: command-line flags over ``LOCKD_*`` environment variables over defaults.

=====================  ========================  ======================================================
setting                environment               default, meaning
=====================  ========================  ======================================================
``store``              ``LOCKD_STORE``           ``sqlite:///./lockd.db``; see ``lockd.server.store``
``host``               ``LOCKD_HOST``            ``127.0.0.1``
``port``               ``LOCKD_PORT``            ``7070`` (0: any free port; the ready line shows it)
``key_dir``            ``LOCKD_KEY_DIR``         ``./lockd-keys``: Ed25519 signing keys, made on first start
``min_ttl_ms``         ``LOCKD_MIN_TTL_MS``      ``100``: shortest lease a client may ask for
``max_ttl_ms``         ``LOCKD_MAX_TTL_MS``      ``3600000`` (1 h): longest lease
``max_wait_ms``        ``LOCKD_MAX_WAIT_MS``     ``300000`` (5 min): longest ``wait_ms`` of an acquire
``max_body_bytes``     ``LOCKD_MAX_BODY_BYTES``  ``65536``: larger request bodies get 413
``log_level``          ``LOCKD_LOG_LEVEL``       ``info``
``workers``            ``LOCKD_WORKERS``         ``1``: processes serving the port (not with SQLite)
=====================  ========================  ======================================================

Operations (``LOCKD_`` + the upper-case name): ``log_format`` ``text`` (default) or ``json``
(one object a line, with request ids); ``api_keys`` (comma-separated bearer keys; none: no key
needed) and ``api_keys_file`` (one key a line, ``#`` comments; adds to ``api_keys``);
``admin_keys`` / ``admin_keys_file`` (keys for force-release and every other call; none:
force-release is disabled, 403); ``max_header_bytes`` (16384: larger request headers get 431);
``events_heartbeat_ms`` (15000: keep-alive comment on idle event streams);
``events_queue_size`` (256: events a slow stream client may lag by before its stream is dropped);
``skew_interval_ms`` (10000: how often the store's clock is sampled);
``key_reload_ms`` (5000: how often the key directory is re-read, so ``lockd keys rotate`` and
``retire`` reach a running lockd without a restart; ``lockd.server.keydir``).

Connection bounds (``lockd.common.serving.connections``; flags ``--request-timeout-ms`` and alike):
``request_timeout_ms`` (``LOCKD_REQUEST_TIMEOUT_MS``, 10000: a request must arrive whole,
headers and body, within this or the connection is closed; also the longest an idle connection
waits for its first request); ``max_connections`` (``LOCKD_MAX_CONNECTIONS``, 1000: beyond, a
new connection gets 503 ``overloaded`` with ``Retry-After``; keep it below ``ulimit -n``);
``write_timeout_ms`` (``LOCKD_WRITE_TIMEOUT_MS``, 10000: a client that reads nothing of its
answer for this long is disconnected); ``max_event_streams`` (``LOCKD_MAX_EVENT_STREAMS``, 100:
beyond, an event stream request gets 503 ``too_many_streams`` with ``Retry-After``).
The PostgreSQL store reads ``LOCKD_PG_BATCH`` itself (1, the default: the exclusive acquires and
releases of one event-loop turn go in one statement each; 0: one statement per request; the
store URL's ``?batch=`` wins; docs/stores/postgres.md, "Batches").
Access (``lockd.server.access``): ``access_file`` (``LOCKD_ACCESS_FILE``: YAML of identities with
lock-name prefixes; refused at start if malformed); ``max_leases_per_identity`` (100000) and
``max_waiters_per_identity`` (10000): per identity at this process, beyond: 429
(``lockd.server.limits``).
TLS (opt-in; ``lockd.common.tls``): ``tls_cert`` / ``tls_key`` (``LOCKD_TLS_CERT``,
``LOCKD_TLS_KEY``: PEM files; both or neither; with them lockd serves https only);
``tls_client_ca`` (``LOCKD_TLS_CLIENT_CA``: clients must present a certificate signed by this
CA, mTLS); ``cert_clients`` / ``cert_admins`` (``LOCKD_CERT_CLIENTS``, ``LOCKD_CERT_ADMINS``:
``;``-separated RFC 4514 subjects of client certificates that stand for a client key / an admin
key; need ``tls_client_ca``).

Out-of-range values are rejected at start (pydantic ``ValidationError``), not clamped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from lockd.common.options import tls_problem
from lockd.common.tls import parse_subjects
from lockd.server.store import check_store_url

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Validated lockd configuration; build with ``Settings(**overrides)`` (overrides win)."""

    model_config = SettingsConfigDict(env_prefix="LOCKD_", extra="ignore", frozen=True)

    store: str = "sqlite:///./lockd.db"
    host: str = "127.0.0.1"
    port: int = Field(7070, ge=0, le=65535)
    key_dir: Path = Path("./lockd-keys")
    key_reload_ms: int = Field(5000, ge=50)
    min_ttl_ms: int = Field(100, ge=1)
    max_ttl_ms: int = Field(3_600_000, ge=1)
    max_wait_ms: int = Field(300_000, ge=0)
    max_body_bytes: int = Field(65_536, ge=1024, le=16 * 1024 * 1024)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = "text"
    workers: int = Field(1, ge=1, le=64)
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    api_keys_file: Path | None = None
    admin_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    admin_keys_file: Path | None = None
    max_header_bytes: int = Field(16_384, ge=1024, le=1024 * 1024)
    events_heartbeat_ms: int = Field(15_000, ge=50, le=300_000)
    events_queue_size: int = Field(256, ge=1, le=100_000)
    skew_interval_ms: int = Field(10_000, ge=100)
    # --- connection bounds (lockd.common.serving.connections) ---
    request_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    max_connections: int = Field(1000, ge=1, le=1_000_000)
    write_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    max_event_streams: int = Field(100, ge=0, le=100_000)
    # --- access (lockd.server.access) and per-identity bounds (lockd.server.limits) ---
    access_file: Path | None = None
    max_leases_per_identity: int = Field(100_000, ge=1, le=100_000_000)
    max_waiters_per_identity: int = Field(10_000, ge=1, le=10_000_000)

    # --- TLS: https with --tls-cert/--tls-key, mTLS with --tls-client-ca ---
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    cert_clients: Annotated[tuple[str, ...], NoDecode] = ()
    cert_admins: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("cert_clients", "cert_admins", mode="before")
    @classmethod
    def _subjects(cls, value: object) -> object:
        return parse_subjects(value) if isinstance(value, str | list | tuple) else value

    @model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        problem = tls_problem(self.tls_cert, self.tls_key, self.tls_client_ca,
                              bool(self.cert_clients or self.cert_admins))
        if problem:
            raise ValueError(problem)
        return self

    @property
    def scheme(self) -> str:
        """``https`` when TLS is configured, else ``http``."""
        return "https" if self.tls_cert is not None else "http"

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k for k in value.replace(",", " ").split() if k)
        return value

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        return check_store_url(value)

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _ttl_bounds(self) -> Settings:
        if self.min_ttl_ms > self.max_ttl_ms:
            raise ValueError(f"min_ttl_ms ({self.min_ttl_ms}) exceeds max_ttl_ms ({self.max_ttl_ms})")
        return self
