"""What the annotation server checks before it starts: exposure without passwords, the auth file, shipped prompts.

`commands.serve` starts the server with these; the server itself never loads a model (pairs and rounds are made by
child processes).
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path
from typing import Callable

from annotate.importers import PromptImportError
from annotate.store import Store
from annotate.ui_session import clean_name

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_PROMPTS = PROJECT_ROOT / "data" / "prompts.jsonl"
SHIPPED_GUIDELINES = PROJECT_ROOT / "data" / "guidelines.md"
LOCAL_HOSTS = {"localhost"}


class ServeError(Exception):
    """A problem with how the app was started that the user can fix; the message says how."""


def is_local_host(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, share: bool, auth_file: str | None) -> None:
    """Refuse to put the app where others can reach it without passwords: votes decide what the model learns."""
    if auth_file:
        return
    if share:
        raise ServeError(
            "--share publishes the app on a public gradio.live link, so anyone with the link could vote and act as "
            "admin. Give people passwords with --auth FILE (one name:password per line) and start again."
        )
    if not is_local_host(host):
        raise ServeError(
            f"--host {host} lets other machines reach the app, and without passwords anyone could vote under any "
            "name or act as admin. Add --auth FILE (one name:password per line), or keep the default --host "
            "127.0.0.1."
        )


def read_auth_file(path: str | Path) -> dict[str, str]:
    """name:password lines (blank lines and # comments ignored) -> {name: password}."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ServeError(f"cannot read the auth file {path}: {error.strerror or error}") from None
    passwords: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        raw_name, colon, password = line.partition(":")
        name, problem = clean_name(raw_name)
        if not colon or name is None or not password:
            raise ServeError(f"{path}, line {number}: expected name:password with both parts non-empty"
                             f"{f' ({problem})' if problem and colon else ''}.")
        if name in passwords:
            raise ServeError(f"{path}, line {number}: {name} appears twice.")
        passwords[name] = password
    if not passwords:
        raise ServeError(f"{path} holds no name:password line.")
    return passwords


def password_checker(passwords: dict[str, str]) -> Callable[[str, str], bool]:
    def check(name: str, password: str) -> bool:
        expected = passwords.get(" ".join((name or "").split()))
        # compare_digest on every attempt, so the time taken does not tell which names exist
        return hmac.compare_digest((expected or "\0").encode(), (password or "").encode()) and expected is not None

    return check


def seed_prompts(store: Store, path: Path = SHIPPED_PROMPTS) -> str:
    """On an empty database, import the shipped prompts; returns a line for the terminal ("" when not needed)."""
    if store.count_prompts() > 0:
        return ""
    if not path.is_file():
        return f"The database has no prompts and {path} is missing: import prompts in the Admin tab."
    try:
        result = store.import_prompts(path)
    except (PromptImportError, ValueError) as error:
        return f"Could not import the shipped prompts: {error}"
    return f"Imported {result.added} prompts from {path}."
