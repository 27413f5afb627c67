"""The API-key file: one record per key, only a salted SHA-256 of each key stored, written atomically.

Why SHA-256 with a per-file salt and not scrypt: the keys are 32 random bytes (256 bits), so no guessing attack
is helped by a slow hash, while scrypt would add milliseconds to every request. The salt keeps two key files'
hashes unrelated; presented keys are hashed once and compared with every stored hash in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError

SCHEMA_VERSION = 1
KEY_PREFIX = "sk-kit-"
PERIODS = ("day", "month")


@dataclass(frozen=True)
class KeyRecord:
    """One key's name, owner and limits (None: unlimited), and the hash of its secret."""

    name: str
    key_hash: str
    tenant: str | None = None
    models: tuple[str, ...] = ()  # empty: every model
    rps: float | None = None
    tpm: int | None = None
    quota_tokens: int | None = None
    quota_period: str | None = None
    revoked: bool = False
    admin: bool = False  # may read the gateway's per-key metrics
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        for name in ("rps", "tpm", "quota_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise KitUsageError(f"key {self.name!r}: {name} must be positive, got {value!r}.")
        if (self.quota_tokens is None) != (self.quota_period is None) or (
                self.quota_period is not None and self.quota_period not in PERIODS):
            raise KitUsageError(f"key {self.name!r}: a quota needs both --quota-tokens and --quota-period day|month, "
                                f"got {self.quota_tokens!r} per {self.quota_period!r}.")

    def may_use(self, model: str) -> bool:
        """Whether this key may call ``model``.

        Arguments:
            model: the requested model name.
        """
        return not self.models or model in self.models

    def public(self) -> dict[str, Any]:
        """The record without its hash (what ``keys list`` shows)."""
        values = asdict(self)
        del values["key_hash"]
        values["models"] = list(self.models)
        return values


@dataclass(frozen=True)
class KeyFile:
    """The parsed key file: its salt and records."""

    salt: str
    records: tuple[KeyRecord, ...] = ()

    def hash(self, key: str) -> str:
        """The stored form of ``key``.

        Arguments:
            key: a presented or new secret.
        """
        # a header that is not UTF-8 arrives with surrogate escapes: hashed as its bytes, it matches no key
        return hashlib.sha256(bytes.fromhex(self.salt) + key.encode("utf-8", "surrogateescape")).hexdigest()

    def find(self, key: str) -> KeyRecord | None:
        """The live record of ``key`` (None when unknown or revoked), compared with every hash in constant time.

        Arguments:
            key: the presented secret.
        """
        digest = self.hash(key).encode()
        found = None
        for record in self.records:
            if hmac.compare_digest(digest, record.key_hash.encode()) and not record.revoked:
                found = record
        return found

    def named(self, name: str) -> KeyRecord | None:
        return next((r for r in self.records if r.name == name), None)


def read_keys(path: Path) -> KeyFile:
    """Read a key file (a new, empty one with a fresh salt when ``path`` does not exist).

    Arguments:
        path: the JSON key file.
    """
    if not path.exists():
        return KeyFile(salt=secrets.token_hex(16))
    try:
        data = json.loads(path.read_text())
        records = tuple(KeyRecord(**{**r, "models": tuple(r.get("models", ()))}) for r in data["keys"])
        return KeyFile(salt=data["salt"], records=records)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KitUsageError(f"{path} is not a trtllm-kit key file ({type(exc).__name__}: {exc}); create keys with "
                            "trtllm-kit keys add NAME --keys FILE.") from None


def write_keys(path: Path, keys: KeyFile) -> None:
    """Write ``keys`` to ``path`` atomically, readable by its owner only.

    Arguments:
        path: the JSON key file; keys: what to write.
    """
    data = {"schema_version": SCHEMA_VERSION, "salt": keys.salt,
            "keys": [{**asdict(r), "models": list(r.models)} for r in keys.records]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def add_key(path: Path, name: str, **limits: Any) -> tuple[str, KeyRecord]:
    """Create a key named ``name`` in ``path``; return the secret (shown once, never stored) and its record.

    Arguments:
        path: the key file; name: a name unique in the file; limits: ``KeyRecord`` fields (tenant, models, ...).
    """
    keys = read_keys(path)
    if keys.named(name) is not None:
        raise KitUsageError(f"{path} already has a key named {name!r}; pick another name or revoke it first.")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(name=name, key_hash=keys.hash(secret), **limits)
    write_keys(path, replace(keys, records=(*keys.records, record)))
    return secret, record


def revoke_key(path: Path, name: str) -> KeyRecord:
    """Mark the key ``name`` revoked (kept, so its usage stays attributed).

    Arguments:
        path: the key file; name: the key's name.
    """
    keys = read_keys(path)
    record = keys.named(name)
    if record is None:
        names = ", ".join(r.name for r in keys.records) or "none"
        raise KitUsageError(f"{path} has no key named {name!r}; it has {names}.")
    revoked = replace(record, revoked=True)
    write_keys(path, replace(keys, records=tuple(revoked if r.name == name else r for r in keys.records)))
    return revoked
