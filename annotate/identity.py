"""Who someone is: the one normalisation of names, and the signed session token that keeps a browser signed in.

A name is stored in its normalised form and that one string is the person everywhere (votes, demonstrations,
roles, the auth file, session tokens): Unicode NFKC, whitespace collapsed, case folded. "ALICE", "alice" and
"alice " are one person, so SQL's UNIQUE (pair_id, annotator) keeps them to one vote per pair. The price: names are
shown as stored ("Ada Lovelace" signs in as "ada lovelace"); a separate display spelling would have to be looked up
by every page and export that shows a name, and could drift from the identity. Invisible characters (format and
control: a zero-width space, a right-to-left mark) are refused rather than dropped, so a name never looks like
another one it is not.

A session token is `v1.<name, base64>.<expiry, unix seconds>.<HMAC-SHA256, base64>`, signed with a secret kept in
a file beside the database (mode 0600): it survives a reload and a server restart, and ends after `lifetime_s` or
when the secret file is replaced.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
import unicodedata
from pathlib import Path
from typing import Callable

from annotate.text_limits import character_name, control_characters

MAX_NAME_CHARS = 64
SESSION_DAYS = 14
COOKIE_PREFIX = "rlhf-loop-session"


def _normalise(text: str) -> str:
    # NFKC folds look-alike forms (full-width letters, ligatures, a no-break space) into one; case folding can undo
    # NFKC for a few characters, hence NFKC again (Unicode's NFKC_Casefold, near enough).
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    return " ".join(unicodedata.normalize("NFKC", text.casefold()).split())


def clean_name(raw: str | None) -> tuple[str | None, str]:
    """(the normalised name, "") for an acceptable name, else (None, why not, for the person who typed it).

    The one place names are normalised: sign-in, roles, the auth file, the store and session tokens all use it.
    """
    name = _normalise(raw or "")
    if not name:
        return None, "Type your name to sign in."
    hidden = control_characters(name, allowed="", invisible=True)
    if hidden:
        shown = ", ".join(map(character_name, hidden))
        return None, f"Names cannot hold invisible or control characters (found {shown})."
    if len(name) > MAX_NAME_CHARS:
        return None, f"Please use a shorter name (at most {MAX_NAME_CHARS} characters)."
    return name, ""


def migrated_name(raw: str) -> str | None:
    """What a name stored before names were normalised becomes: invisible characters dropped, then clean_name;
    None when nothing acceptable is left (the migration then keeps the old name)."""
    hidden = control_characters(raw, allowed="", invisible=True)
    return clean_name("".join(char for char in raw if char.isspace() or char not in hidden))[0]


# session tokens -------------------------------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def read_or_create_secret(path: Path) -> bytes:
    """The signing secret in `path`, created (32 random bytes, hex, mode 0600) when the file does not exist."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        secret = path.read_text(encoding="ascii").strip()
        if not secret:
            raise RuntimeError(f"{path} is empty: delete it and start again (everyone signs in again)") from None
        return bytes.fromhex(secret)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(secrets.token_hex(32) + "\n")
    return read_or_create_secret(path)


class SessionTokens:
    """Signs and checks session tokens; the browser keeps one in a cookie named `cookie_name`."""

    def __init__(self, secret: bytes, cookie_name: str = COOKIE_PREFIX, lifetime_s: float = SESSION_DAYS * 86400,
                 clock: Callable[[], float] = time.time):
        self._secret = secret
        self.cookie_name = cookie_name
        self.lifetime_s = lifetime_s
        self.clock = clock

    @classmethod
    def beside(cls, db_path: str | Path, **settings) -> "SessionTokens":
        """Tokens signed with `<db>.session-key` (created on first start); a random secret for ":memory:".

        The cookie's name carries a digest of the database's path, so two apps on one host (cookies do not tell
        ports apart) do not end each other's sessions."""
        if str(db_path) == ":memory:":
            return cls(secrets.token_bytes(32), f"{COOKIE_PREFIX}-{secrets.token_hex(5)}", **settings)
        path = Path(db_path).resolve()
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
        secret = read_or_create_secret(path.with_name(path.name + ".session-key"))
        return cls(secret, f"{COOKIE_PREFIX}-{digest}", **settings)

    def _mac(self, name: str, expiry: int) -> bytes:
        return hmac.new(self._secret, f"v1\n{name}\n{expiry}".encode(), hashlib.sha256).digest()

    def issue(self, name: str) -> str:
        expiry = int(self.clock() + self.lifetime_s)
        return f"v1.{_b64(name.encode())}.{expiry}.{_b64(self._mac(name, expiry))}"

    def verify(self, token: str | None) -> tuple[str | None, str]:
        """(name, "") for a token this app signed that has not expired, else (None, why the session ended)."""
        ended = "Your session ended (the app's sign-in key changed); sign in again."
        try:
            version, name_b64, expiry_text, mac_b64 = (token or "").split(".")
            name, expiry, mac = _unb64(name_b64).decode(), int(expiry_text), _unb64(mac_b64)
        except ValueError:  # wrong number of parts, bad base64, not UTF-8, not a number
            return None, ended
        if version != "v1" or not hmac.compare_digest(mac, self._mac(name, expiry)):
            return None, ended
        if expiry <= self.clock():
            days = round(self.lifetime_s / 86400)
            return None, f"Your session ended (sessions last {days} days); sign in again."
        cleaned, _problem = clean_name(name)
        return (cleaned, "") if cleaned == name else (None, ended)

    def cookie(self, token: str) -> str:
        """A `document.cookie` assignment that keeps the token for its lifetime (SameSite=Strict: other sites'
        pages cannot send it)."""
        return f"{self.cookie_name}={token}; Max-Age={int(self.lifetime_s)}; Path=/; SameSite=Strict"

    def clearing_cookie(self) -> str:
        return f"{self.cookie_name}=; Max-Age=0; Path=/; SameSite=Strict"

    def from_request(self, request) -> tuple[str | None, str]:
        """(name, "") from the request's session cookie; (None, "") without one; (None, why) for one that ended."""
        cookies = getattr(request, "cookies", None) or {}
        token = cookies.get(self.cookie_name)
        return self.verify(token) if token else (None, "")
