"""API keys: a file of `name:sha256hex` lines, re-read when it changes, checked in constant time. A request
asks for its caller's name through ocr_app/http/deps.py's require_caller."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ocr_app.auth")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
HASH_RE = re.compile(r"^[0-9a-f]{64}$")
KEY_PREFIX = "ocr_"


class KeyFileError(Exception):
    pass


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key_file(text: str, source: str = "keys file") -> list[tuple[str, bytes]]:
    entries: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, digest = line.partition(":")
        digest = digest.strip().lower()
        if not sep or not NAME_RE.match(name) or not HASH_RE.match(digest):
            raise KeyFileError(f"{source}:{n}: expected 'name:sha256hex'")
        if name in seen:
            raise KeyFileError(f"{source}:{n}: duplicate name {name!r}")
        seen.add(name)
        entries.append((name, bytes.fromhex(digest)))
    return entries


# mutation: ReplaceTrueWithFalse here is equivalent: nothing assigns to a snapshot's fields.
@dataclass(frozen=True)
class _Snapshot:
    stamp: tuple[int, int, int, int]
    entries: list[tuple[str, bytes]]


class KeyStore:
    """Holds the parsed key file; `authenticate` re-reads it when its stat changes.

    A file that becomes unreadable or malformed keeps the last good keys (and logs why), so a bad
    edit never locks every caller out.
    """

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        # mutation: NumberReplacer here is equivalent: reload(force=True) replaces this stamp before any read.
        self._snap = _Snapshot((0, 0, 0, 0), [])
        self.reload(force=True)

    def _stamp(self) -> tuple[int, int, int, int]:
        st = self.path.stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def reload(self, force: bool = False) -> bool:
        """Re-read the file if it changed; True when new keys were loaded."""
        try:
            stamp = self._stamp()
            if not force and stamp == self._snap.stamp:
                return False
            entries = parse_key_file(self.path.read_text(), str(self.path))
        except (OSError, KeyFileError, UnicodeDecodeError) as err:
            if force and not self._snap.entries:
                raise KeyFileError(f"cannot load API keys: {err}") from None
            log.error("keeping previous API keys: %s", err)
            return False
        with self._lock:
            self._snap = _Snapshot(stamp, entries)
        log.info("loaded API keys", extra={"keys": len(entries), "file": str(self.path)})
        return True

    def __len__(self) -> int:
        return len(self._snap.entries)

    def authenticate(self, key: str) -> str | None:
        """The caller's name for a valid key, else None. Compares against every entry."""
        self.reload()
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        for name, expected in self._snap.entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = name
        return found

    def digest_of(self, name: str) -> str | None:
        """The sha256 hex of the key named `name` (a job's owner): what signs its webhooks; None: no such
        key."""
        self.reload()
        for entry, digest in self._snap.entries:
            if entry == name:
                return digest.hex()
        return None


def add_key(path: Path, name: str) -> str:
    """Append a new random key's hash for `name`; returns the clear key (shown once)."""
    if not NAME_RE.match(name):
        raise KeyFileError(f"invalid key name {name!r}: use letters, digits, '_', '.', '@', '-'")
    text = path.read_text() if path.exists() else ""
    if any(n == name for n, _ in parse_key_file(text, str(path))):
        raise KeyFileError(f"a key named {name!r} already exists in {path}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    if text and not text.endswith("\n"):
        text += "\n"
    _write_atomic(path, text + f"{name}:{hash_key(key)}\n")
    return key


def remove_key(path: Path, name: str) -> None:
    text = path.read_text()
    parse_key_file(text, str(path))
    # mutation: NumberReplacer to `":", 2)` is equivalent: a name holds no ':', field 0 is the same.
    kept = [ln for ln in text.splitlines(keepends=True) if ln.split(":", 1)[0].strip() != name]
    # mutation: ReplaceTrueWithFalse here is equivalent: keepends changes no line count.
    if len(kept) == len(text.splitlines(keepends=True)):
        raise KeyFileError(f"no key named {name!r} in {path}")
    _write_atomic(path, "".join(kept))


def _write_atomic(path: Path, text: str) -> None:
    # The server may re-read at any moment: it must see the old file or the new one, never half.
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o640
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if path.exists():
            st = path.stat()
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        # mutation: ReplaceTrueWithFalse here is equivalent: tmp exists until os.replace, the last step.
        Path(tmp).unlink(missing_ok=True)
        raise
