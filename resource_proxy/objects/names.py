"""Buckets, object keys and the ONE lock that governs each object.

A bucket name is 1-63 characters of ``A-Za-z0-9._-``, starting with a letter or digit, never
``..`` inside (so it is also a lock name). An object key is what follows the bucket in the
URL, percent-decoded strictly (UTF-8): 1-1024 bytes, ``/``-separated segments of 1-255 bytes,
no empty, ``.`` or ``..`` segment (no leading, trailing or doubled ``/``), no backslash, no
NUL or other control character. A key is never a path: blob names are generated (``blobs``),
so these rules keep keys portable and unambiguous, not the root safe (nothing is derived from
a key on disk at all). A key that breaks them is 422 with nothing written.

Which lock governs an object (one object, one lock, like one row, one lock): without a policy
entry, every object of bucket ``B`` is written under the lock named ``B``. The policy file's
``buckets`` gives a bucket ONE template over the key's segments::

    buckets:
      reports: "reports/{1}"          # reports/2026/q4.pdf is written under lock reports/2026
      models: {lock: "models/{key}"}  # one lock per object: models/a/b.bin -> models/a/b.bin

``{N}`` is segment N (1-based), ``{key}`` the whole key (each segment escaped as row key values
are: ``canonical.encode``; segments joined by ``/``). Two placeholders must be separated by a
literal ``/`` and literals are lock-name characters; anything else is refused at start
(``PolicyError``). An object whose key has fewer segments than its template needs, or whose
lock name would exceed 255 characters, cannot be written (422).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from resource_proxy.canonical import encode
from resource_proxy.errors import InvalidRequest

__all__ = ["BUCKET_RULE", "KEY_RULE", "MAX_KEY_BYTES", "BucketTemplate", "Buckets",
           "parse_bucket", "parse_key", "parse_buckets"]

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 255
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_LITERAL = re.compile(r"[A-Za-z0-9._:/-]*")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
BUCKET_RULE = ("a bucket name is 1-63 characters of A-Z a-z 0-9 . _ -, starting with a letter "
               "or digit, without '..'")
KEY_RULE = (f"an object key is 1-{MAX_KEY_BYTES} bytes of UTF-8 in '/'-separated segments of "
            f"1-{MAX_SEGMENT_BYTES} bytes: no empty, '.' or '..' segment, no backslash, no "
            "control character")


class _PolicyError(ValueError):
    """A bad ``buckets`` entry (``policy.PolicyError`` wraps it with the file's name)."""


def parse_bucket(raw: str) -> str:
    """The bucket of a URL (percent-decoded); ``InvalidRequest`` (422) unless ``BUCKET_RULE``."""
    text = _decode(raw, "bucket")
    if not _BUCKET.fullmatch(text) or ".." in text:
        raise InvalidRequest(BUCKET_RULE, bucket=text[:100])
    return text


def _decode(raw: str, what: str) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"the {what} is not UTF-8 once percent-decoded") from None


def check_key(text: str) -> str:
    """``text`` if it is an object key (``KEY_RULE``), else ``InvalidRequest`` (422)."""
    data = text.encode("utf-8", "surrogatepass")
    reason = None
    if not data:
        reason = "the key is empty"
    elif len(data) > MAX_KEY_BYTES:
        reason = f"the key is {len(data)} bytes long"
    elif _CONTROL.search(text):
        reason = "the key contains a control character"
    elif "\\" in text:
        reason = "the key contains a backslash"
    else:
        for segment in text.split("/"):
            if segment in ("", ".", ".."):
                reason = f"the key has a segment {segment!r}"
                break
            if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
                reason = "a segment of the key is longer than 255 bytes"
                break
    if reason is not None:
        raise InvalidRequest(f"{reason}: {KEY_RULE}")
    return text


def parse_key(raw: str) -> str:
    """The key of a URL (as sent, percent-encoded): decoded strictly, then ``check_key``."""
    return check_key(_decode(raw, "key"))


@dataclass(frozen=True, slots=True)
class BucketTemplate:
    """A bucket's lock template: ``("lit", text)`` and ``("var", "key" | "N")`` parts."""

    text: str
    parts: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: Any, where: str) -> BucketTemplate:
        if not isinstance(text, str) or not text:
            raise _PolicyError(f"{where}: the lock must be one template string, got {text!r}")
        parts: list[tuple[str, str]] = []
        pos = 0
        for match in _PLACEHOLDER.finditer(text):
            if match.start() > pos:
                parts.append(("lit", text[pos:match.start()]))
            name = match.group(1)
            if name != "key" and not (name.isascii() and name.isdigit() and int(name) >= 1):
                raise _PolicyError(f"{where}: placeholder {{{name}}} is neither {{key}} nor a "
                                   "segment number {1}, {2}, ...")
            between = [v for k, v in reversed(parts) if k == "lit"][:1] if parts else []
            if parts and (parts[-1][0] == "var" or "/" not in between[0]) and any(
                    k == "var" for k, _ in parts):
                raise _PolicyError(f"{where}: two placeholders must be separated by a literal "
                                   "'/' (else one lock name could stand for several keys)")
            parts.append(("var", name))
            pos = match.end()
        if pos < len(text):
            parts.append(("lit", text[pos:]))
        for kind, value in parts:
            if kind == "lit" and (not _LITERAL.fullmatch(value) or "{" in value or "}" in value):
                raise _PolicyError(f"{where}: {value!r} has characters a lock name cannot have "
                                   "(A-Z a-z 0-9 . _ : / -)")
        return cls(text, tuple(parts))

    def pattern(self) -> re.Pattern[str]:
        """The names this template makes (each segment escaped: no ``/`` inside one)."""
        part = r"[A-Za-z0-9._:-]+"
        return re.compile("".join(
            re.escape(v) if k == "lit" else (f"{part}(?:/{part})*" if v == "key" else part)
            for k, v in self.parts))

    def lock_for(self, key: str) -> str:
        segments = key.split("/")
        out: list[str] = []
        for kind, value in self.parts:
            if kind == "lit":
                out.append(value)
            elif value == "key":
                out.append("/".join(encode(s) for s in segments))
            else:
                index = int(value)
                if index > len(segments):
                    raise InvalidRequest(f"the bucket's lock template {self.text!r} needs at "
                                         f"least {index} key segment(s)")
                out.append(encode(segments[index - 1]))
        return "".join(out)


class Buckets:
    """Every bucket's lock: a template from the policy, else the bucket's own name."""

    def __init__(self, templates: Mapping[str, BucketTemplate] | None = None):
        self.templates = dict(templates or {})

    def lock_for(self, bucket: str, key: str) -> str:
        """The one lock that governs object ``key`` of ``bucket`` (422 if it cannot have one)."""
        template = self.templates.get(bucket)
        if template is None:
            return bucket
        lock = template.lock_for(key)
        if not 1 <= len(lock) <= 255:
            raise InvalidRequest(f"the object's lock name would be {len(lock)} characters long "
                                 "(a lock name has at most 255)")
        return lock

    def governing(self, lock: str) -> list[str]:
        """The buckets whose objects ``lock`` may govern: the bucket named ``lock`` if no
        template replaces its lock, and each bucket whose template can make ``lock``."""
        out = [bucket for bucket, t in self.templates.items() if t.pattern().fullmatch(lock)]
        if _BUCKET.fullmatch(lock) and ".." not in lock and lock not in self.templates:
            out.insert(0, lock)
        return out

    def governs(self, lock: str) -> bool:
        """Whether ``lock`` is the lock of some object: a bucket name no template replaces, or
        a name one of the templates makes."""
        return bool(self.governing(lock))

    def describe(self, bucket: str) -> str | None:
        template = self.templates.get(bucket)
        return template.text if template is not None else None


def parse_buckets(raw: Any, where: str = "buckets") -> Buckets:
    """The policy file's ``buckets`` mapping (``ValueError`` naming the entry otherwise)."""
    if raw is None:
        return Buckets()
    if not isinstance(raw, dict):
        raise _PolicyError(f"{where} must be a mapping of bucket: template")
    templates: dict[str, BucketTemplate] = {}
    for name, entry in raw.items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not _BUCKET.fullmatch(name) or ".." in name:
            raise _PolicyError(f"{at}: {BUCKET_RULE}")
        if isinstance(entry, dict):
            unknown = set(entry) - {"lock"}
            if unknown or "lock" not in entry:
                raise _PolicyError(f"{at}: takes 'lock' (one template), got {sorted(entry)}")
            entry = entry["lock"]
        if isinstance(entry, list):
            raise _PolicyError(f"{at}: a list of templates is refused: give each bucket ONE "
                               "template, so every object has exactly one lock")
        templates[name] = BucketTemplate.parse(entry, at)
    return Buckets(templates)
