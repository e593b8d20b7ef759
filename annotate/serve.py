"""What the annotation server checks before it starts: exposure without passwords, the auth file, shipped prompts.

`commands.serve` starts the server with these; the server itself never loads a model (pairs and rounds are made by
child processes).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from annotate.importers import PromptImportError
from annotate.store import Store
from annotate.text_limits import MAX_PROMPT_CHARS

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
            "admin. Give people passwords (python app.py --add-user NAME writes them to an auth file) and start again "
            "with --auth FILE."
        )
    if not is_local_host(host):
        raise ServeError(
            f"--host {host} lets other machines reach the app, and without passwords anyone could vote under any "
            "name or act as admin. Give people passwords (python app.py --add-user NAME) and add --auth FILE, or "
            "keep the default --host 127.0.0.1."
        )


def seed_prompts(store: Store, path: Path = SHIPPED_PROMPTS, max_prompt_chars: int = MAX_PROMPT_CHARS) -> str:
    """On an empty database, import the shipped prompts; returns a line for the terminal ("" when not needed)."""
    if store.count_prompts() > 0:
        return ""
    if not path.is_file():
        return f"The database has no prompts and {path} is missing: import prompts in the Admin tab."
    try:
        result = store.import_prompts(path, max_prompt_chars=max_prompt_chars)
    except (PromptImportError, ValueError) as error:
        return f"Could not import the shipped prompts: {error}"
    return f"Imported {result.added} prompts from {path}."
