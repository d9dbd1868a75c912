"""Configuration of one proxy process: flags of ``resource-proxy serve`` or ``PROXY_*`` variables.

Defaults: the embedded SQLite database ``sqlite:///./resource.db``, ``127.0.0.1:7071``. Exactly
one key source is required: ``lockd_url`` (JWKS fetched from ``{lockd_url}/v1/keys``, refetched
on an unknown ``kid`` at most once per ``jwks_refetch_interval_ms``, and when older than
``jwks_max_age_ms``, 60000 like lockd's ``Cache-Control``: a retired key stops verifying within
it) or ``jwks_file`` (re-read as often). ``access_file`` (``PROXY_ACCESS_FILE``): which tables
each client identity may write or read fenced (``resource_proxy.access``).

TLS (opt-in, ``lockd.common.tls``): ``tls_cert``/``tls_key`` (``PROXY_TLS_CERT``,
``PROXY_TLS_KEY``; both or neither: the proxy then serves https only), ``tls_client_ca``
(``PROXY_TLS_CLIENT_CA``: mTLS, clients need a certificate signed by it), ``cert_clients``
(``PROXY_CERT_CLIENTS``: ``;``-separated RFC 4514 subjects of client certificates that stand for
an API key). Towards an https ``lockd_url``: ``lockd_ca`` (``PROXY_LOCKD_CA``: the CA that signed
lockd's certificate; default: the system's CAs) and ``lockd_cert``/``lockd_key``
(``PROXY_LOCKD_CERT``, ``PROXY_LOCKD_KEY``: the proxy's client certificate when lockd asks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from lockd.common.options import tls_problem
from lockd.common.tls import parse_subjects

__all__ = ["Settings"]

_SCHEMES = ("sqlite://", "postgresql://", "postgresql+psycopg://", "postgres://")


class Settings(BaseSettings):
    """Every knob of the proxy. Durations are milliseconds, sizes bytes."""

    model_config = SettingsConfigDict(env_prefix="PROXY_", extra="ignore")

    database_url: str = "sqlite:///./resource.db"
    lockd_url: str | None = None
    jwks_file: Path | None = None
    # Allow-list; None: every table of the database's default schema except the proxy's own.
    tables: Annotated[list[str] | None, NoDecode] = None
    policy: Path | None = None
    # Refuse to start unless every fenced table is also protected by the database's own fence
    # triggers (``resource-proxy db install``; PostgreSQL only).
    require_db_fencing: bool = False
    host: str = "127.0.0.1"
    port: int = Field(7071, ge=0, le=65535)

    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_batch_ops: int = Field(1000, ge=1)
    pool_size: int = Field(10, ge=1, le=1000)
    # Worker processes (``workers``); None: the number of CPUs (PostgreSQL), 1 (SQLite).
    workers: int | None = Field(None, ge=1, le=256)
    # How long a request waits for a database connection (and a connect attempt) before 503.
    db_timeout_ms: int = Field(3000, ge=100)
    # PostgreSQL: the longest any of the proxy's statements waits for a lock (a fence row held
    # by another transaction's claim, a row) before 503 lock_timeout; below db_timeout_ms, so a
    # claim held open cannot take the pool from everyone else (``lock_timeout`` of the session).
    lock_timeout_ms: int = Field(1000, ge=10, le=600_000)
    jwks_refetch_interval_ms: int = Field(1000, ge=0)
    jwks_max_age_ms: int = Field(60_000, ge=100)
    access_file: Path | None = None
    # How long an Idempotency-Key's recorded answer is kept (default 24 h; at least 1 s).
    idempotency_ttl_ms: int = Field(86_400_000, ge=1000)
    # --- fenced objects (``resource_proxy.objects``) ---
    # A directory to serve as the blob backend of /v1/objects (None: no objects are served).
    objects_dir: Path | None = None
    # Or an S3-compatible endpoint (objects.s3; needs the s3 extra): its URL and bucket, and
    # the key prefix under which blobs are kept.
    objects_s3_url: str | None = None
    objects_s3_bucket: str | None = None
    objects_s3_prefix: str = "lockd-objects/"
    # The largest object body (413 above it); bodies are streamed, never held whole.
    max_object_bytes: int = Field(1 << 30, ge=1)
    # A body of at most this many bytes is kept in its pointer row, in the fence's one
    # transaction (one flush instead of the blob's file and directory fsyncs and the WAL's);
    # 0: every body is a blob. At most 1 MiB (a row, held in memory while it is written).
    objects_inline_max: int = Field(16 * 1024, ge=0, le=1 << 20)
    # The orphan sweeper: blobs last written more than objects_grace_ms ago that no pointer
    # names are deleted, at start and every objects_sweep_interval_ms.
    objects_grace_ms: int = Field(600_000, ge=0)
    objects_sweep_interval_ms: int = Field(60_000, ge=100)
    log_level: str = "info"
    # Operations: log lines as text or JSON objects (with request ids); bearer API keys (none:
    # no key needed; comma-separated, plus one a line from the file); bound on request headers.
    log_format: Literal["text", "json"] = "text"
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    api_keys_file: Path | None = None
    max_header_bytes: int = Field(16_384, ge=1024, le=1024 * 1024)
    # --- connection bounds (lockd.common.serving.connections) ---
    # A request must arrive whole (headers and body) within request_timeout_ms or the connection
    # is closed; beyond max_connections open connections a new one gets 503 with Retry-After;
    # a client that reads nothing of its answer for write_timeout_ms is disconnected.
    request_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    max_connections: int = Field(1000, ge=1, le=1_000_000)
    write_timeout_ms: int = Field(10_000, ge=100, le=600_000)

    # --- TLS: serve https / mTLS; fetch lockd's JWKS over https ---
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    cert_clients: Annotated[tuple[str, ...], NoDecode] = ()
    lockd_ca: Path | None = None
    lockd_cert: Path | None = None
    lockd_key: Path | None = None

    @field_validator("cert_clients", mode="before")
    @classmethod
    def _subjects(cls, value: object) -> object:
        return parse_subjects(value) if isinstance(value, str | list | tuple) else value

    @model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        problem = tls_problem(self.tls_cert, self.tls_key, self.tls_client_ca,
                              bool(self.cert_clients))
        if problem:
            raise ValueError(problem)
        if (self.lockd_cert is None) != (self.lockd_key is None):
            raise ValueError("give both lockd_cert (--lockd-cert) and lockd_key (--lockd-key)")
        if (self.lockd_ca or self.lockd_cert) and not (self.lockd_url or "").startswith("https://"):
            raise ValueError("lockd_ca/lockd_cert need an https:// lockd_url")
        return self

    @property
    def scheme(self) -> str:
        """``https`` when TLS is configured, else ``http``."""
        return "https" if self.tls_cert is not None else "http"

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k for k in value.replace(",", " ").split() if k)
        return value

    @field_validator("tables", mode="before")
    @classmethod
    def _split_tables(cls, value: object) -> object:
        if isinstance(value, str):
            names = [part.strip() for part in value.split(",") if part.strip()]
            return names or None
        return value

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(_SCHEMES):
            raise ValueError(
                "database_url must start with sqlite://, postgresql:// or postgresql+psycopg://"
            )
        return value

    @field_validator("lockd_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("lockd_url must be an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_key_source(self) -> Settings:
        if (self.lockd_url is None) == (self.jwks_file is None):
            raise ValueError("give exactly one of lockd_url (--lockd-url) or jwks_file (--jwks-file)")
        return self

    @model_validator(mode="after")
    def _one_blob_store(self) -> Settings:
        if self.objects_dir is not None and self.objects_s3_url is not None:
            raise ValueError("give objects_dir (--objects-dir) or objects_s3_url "
                             "(--objects-s3-url), not both")
        if (self.objects_s3_url is None) != (self.objects_s3_bucket is None):
            raise ValueError("give both objects_s3_url (--objects-s3-url) and objects_s3_bucket "
                             "(--objects-s3-bucket)")
        return self

    @property
    def serves_objects(self) -> bool:
        return self.objects_dir is not None or self.objects_s3_url is not None

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite://")
