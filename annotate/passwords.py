"""Passwords for `--auth FILE`: scrypt hashes, the auth file, and slowing down people who guess.

One line per person, `name:scrypt$N$r$p$salt$hash` (salt and hash in base64, N r p the scrypt cost, recorded so that
older lines still check after the defaults change). A plain `name:password` line still loads, with a warning and a
one-command upgrade (`python app.py --upgrade-auth FILE`). Names go through `annotate.identity.clean_name`, so
"Alice" in the file and "alice " typed at the login are one person.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import time
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, Iterator

from annotate.identity import clean_name

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
"""About 32 MiB and 0.1 s per check on a laptop core (OWASP's minimum is N=2^17 at r=8 on server hardware; a login
blocks the server's event loop for the time of one check)."""
SCRYPT_MAXMEM = 256 * 1024 * 1024
MIN_PASSWORD_CHARS = 8
HASH_PREFIX = "scrypt$"
NEW_FILE_HEADER = "# rlhf-loop auth file: name:scrypt hash, one per line (python app.py --add-user NAME)"


class AuthFileError(Exception):
    """An auth file that cannot be used as it is; the message names the file and line and says what to fix."""


def hash_password(password: str, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """`scrypt$N$r$p$salt$hash` for `password`, with 16 random bytes of salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=SCRYPT_MAXMEM, dklen=32)
    return f"{HASH_PREFIX}{n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    _scheme, n, r, p, salt, digest = stored.split("$")
    return int(n), int(r), int(p), base64.b64decode(salt, validate=True), base64.b64decode(digest, validate=True)


def is_hashed(stored: str) -> bool:
    return stored.startswith(HASH_PREFIX)


def verify_password(password: str, stored: str) -> bool:
    """Check `password` against a hash from hash_password or, for a plain-text line, the text itself."""
    if not is_hashed(stored):
        return hmac.compare_digest(stored.encode(), password.encode())
    n, r, p, salt, digest = _parse_hash(stored)
    candidate = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=SCRYPT_MAXMEM, dklen=len(digest))
    return hmac.compare_digest(candidate, digest)


# the auth file ---------------------------------------------------------------------------------------------------

def _entries(path: Path, lines: list[str]) -> dict[str, tuple[int, str]]:
    """{name: (line index, stored password)} for the name:password lines (blank lines and # comments skipped)."""
    found: dict[str, tuple[int, str]] = {}
    for index, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        raw_name, colon, stored = line.partition(":")
        name, problem = clean_name(raw_name)
        if not colon or name is None or not stored:
            raise AuthFileError(f"{path}, line {index + 1}: expected name:password with both parts non-empty"
                                f"{f' ({problem})' if problem and colon else ''}.")
        if is_hashed(stored):
            try:
                _parse_hash(stored)
            except ValueError:
                raise AuthFileError(f"{path}, line {index + 1}: a broken scrypt$N$r$p$salt$hash entry; set the "
                                    f"password again with python app.py --add-user {name}") from None
        if name in found:
            raise AuthFileError(f"{path}, line {index + 1}: {name} appears twice (also line {found[name][0] + 1}).")
        found[name] = (index, stored)
    return found


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise AuthFileError(f"cannot read the auth file {path}: {error.strerror or error}") from None


def read_auth_file(path: str | Path) -> dict[str, str]:
    """{normalised name: stored password (a hash, or plain text in an old file)}."""
    path = Path(path)
    credentials = {name: stored for name, (_index, stored) in _entries(path, _read_lines(path)).items()}
    if not credentials:
        raise AuthFileError(f"{path} holds no name:password line.")
    return credentials


def auth_file_warnings(path: str | Path, credentials: dict[str, str]) -> list[str]:
    """What is unsafe about an auth file that still loads: plain-text passwords, a mode others can read."""
    warnings = []
    plain = sorted(name for name, stored in credentials.items() if not is_hashed(stored))
    if plain:
        warnings.append(f"{path} holds {len(plain)} plain-text password(s) ({', '.join(plain[:5])}"
                        f"{', ...' if len(plain) > 5 else ''}): store them as scrypt hashes with "
                        f"python app.py --upgrade-auth {path}")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        warnings.append(f"{path} can be read by other users of this machine (mode {mode:04o}): chmod 600 {path}")
    return warnings


def _write_lines(path: Path, lines: list[str]) -> None:
    """Replace the file in one step (a crash leaves the old or the new file, never half of one); mode 0600 for a
    new file, the old mode otherwise."""
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o600
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))
    os.replace(temporary, path)


@contextmanager
def auth_file_lock(path: Path) -> Iterator[None]:
    """Hold `FILE.lock` beside the auth file, waiting for it, for a read-modify-write of the file: two `--add-user`
    at once would otherwise both write what they read, and the first one's line would be lost. The auth file itself
    cannot carry the lock, as _write_lines replaces it with another file. The OS frees it if the process dies."""
    lock_path = path.with_name(f"{path.name}.lock")
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise AuthFileError(f"cannot lock the auth file {path} with {lock_path}: {error.strerror or error}") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # which frees the lock


def set_password(path: str | Path, raw_name: str, password: str, **cost) -> tuple[str, bool]:
    """Write `name:hash` to the auth file (created with mode 0600), replacing that person's line when there is one;
    returns (the normalised name, True when it replaced a line). Other lines and comments are kept as they are."""
    path = Path(path)
    name, problem = clean_name(raw_name)
    if name is None:
        raise AuthFileError(problem)
    if ":" in name:
        raise AuthFileError(f"{name}: names in an auth file cannot hold ':' (it separates name and password).")
    if len(password) < MIN_PASSWORD_CHARS:
        raise AuthFileError(f"Please use a password of at least {MIN_PASSWORD_CHARS} characters.")
    entry = f"{name}:{hash_password(password, **cost)}"  # the slow part, before the lock
    path.parent.mkdir(parents=True, exist_ok=True)
    with auth_file_lock(path):
        lines = _read_lines(path) if path.exists() else [NEW_FILE_HEADER]
        existing = _entries(path, lines).get(name)
        if existing is not None:
            lines[existing[0]] = entry
        else:
            lines.append(entry)
        _write_lines(path, lines)
    return name, existing is not None


def upgrade_auth_file(path: str | Path, **cost) -> tuple[int, Path | None]:
    """Rewrite every plain-text line of the file as a hash; the original is copied first to FILE.bak (mode 0600).
    Returns (lines upgraded, the backup; None when nothing needed upgrading and nothing was written)."""
    path = Path(path)
    if not path.is_file():  # told before a lock file is made beside a mistyped name
        raise AuthFileError(f"cannot read the auth file {path}: no such file")
    with auth_file_lock(path):
        return _upgrade_locked(path, **cost)


def _upgrade_locked(path: Path, **cost) -> tuple[int, Path | None]:
    """upgrade_auth_file's work, done while it holds the auth file's lock."""
    lines = _read_lines(path)
    plain = [(name, index, stored) for name, (index, stored) in _entries(path, lines).items() if not is_hashed(stored)]
    if not plain:
        return 0, None
    backup = path.with_name(path.name + ".bak")
    descriptor = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an older backup may have had a looser mode
    with os.fdopen(descriptor, "wb") as file, open(path, "rb") as original:
        shutil.copyfileobj(original, file)
    for name, index, stored in plain:
        lines[index] = f"{name}:{hash_password(stored, **cost)}"
    _write_lines(path, lines)
    return len(plain), backup


# slowing down guesses ---------------------------------------------------------------------------------------------

class LoginThrottle:
    """Exponential back-off per key (a name, an address): after `free_failures` failures in a row, attempts are
    refused until 2^(failures - free_failures) seconds after the last failure, at most `max_delay_s`.

    A refused attempt does not count as a failure, so someone hammering a name keeps it locked for no longer than
    its current delay. A success clears the key; a key with no failure for `forget_after_s` is forgotten.
    """

    def __init__(self, free_failures: int = 5, max_delay_s: float = 300.0, forget_after_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.free_failures, self.max_delay_s, self.forget_after_s = free_failures, max_delay_s, forget_after_s
        self.clock = clock
        self._failures: dict[str, tuple[int, float]] = {}
        """key -> (failures in a row, clock at the last one)."""

    def _delay(self, failures: int) -> float:
        if failures < self.free_failures:
            return 0.0
        return min(2.0 ** (failures - self.free_failures), self.max_delay_s)

    def failures(self, key: str) -> int:
        """Failures in a row for `key`."""
        return self._failures.get(key, (0, 0.0))[0]

    def wait_s(self, key: str) -> float:
        """Seconds until `key` may try again (0: now)."""
        failures, last = self._failures.get(key, (0, 0.0))
        return max(0.0, last + self._delay(failures) - self.clock()) if failures else 0.0

    def failed(self, key: str) -> None:
        now = self.clock()
        if len(self._failures) > 10_000:  # many names or addresses tried: drop the ones long quiet
            self._failures = {k: v for k, v in self._failures.items() if now - v[1] < self.forget_after_s}
        failures, last = self._failures.get(key, (0, now))
        self._failures[key] = (1 if now - last >= self.forget_after_s else failures + 1, now)

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)


CLIENT_ADDRESS: ContextVar[str | None] = ContextVar("client_address", default=None)
"""The address of the client whose HTTP request is being handled (set by ClientAddressMiddleware)."""


class ClientAddressMiddleware:
    """ASGI middleware that makes the client's address readable during a request: Gradio calls the auth function
    with the name and password only, not the request. Behind a reverse proxy this is the proxy's address
    (X-Forwarded-For is not trusted: any client can write it)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        client = scope.get("client") if scope.get("type") == "http" else None
        if not client:
            await self.app(scope, receive, send)
            return
        token = CLIENT_ADDRESS.set(client[0])
        try:
            await self.app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)


def password_checker(credentials: dict[str, str], by_name: LoginThrottle | None = None,
                     by_address: LoginThrottle | None = None,
                     client_address: Callable[[], str | None] = CLIENT_ADDRESS.get) -> Callable[[str, str], bool]:
    """Gradio's auth function: True when the password is right and neither the name nor the client's address is
    waiting out a back-off. An address gets more failures before it waits (20 against 5 by default): people behind
    one NAT or proxy share it."""
    by_name = by_name or LoginThrottle(free_failures=5)
    by_address = by_address or LoginThrottle(free_failures=20)
    # Unknown names are checked against a hash too, so the time taken does not tell which names exist.
    decoy = hash_password(secrets.token_urlsafe(16))

    def check(raw_name: str, password: str) -> bool:
        name = clean_name(raw_name)[0] or ""
        address = client_address()
        if by_name.wait_s(name) > 0 or (address is not None and by_address.wait_s(address) > 0):
            return False
        stored = credentials.get(name)
        right = verify_password(password or "", stored if stored is not None else decoy) and stored is not None
        if right:
            by_name.succeeded(name)
        else:
            by_name.failed(name)
            if address is not None:
                by_address.failed(address)
        return right

    return check
