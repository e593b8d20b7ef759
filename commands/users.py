"""People and passwords: `--add-user NAME [--role admin|annotator]` and `--upgrade-auth FILE`.

Passwords go to the auth file (`--auth FILE`, else serve.auth, else data/auth.txt) as scrypt hashes; roles live in
the database, so `--role` writes there. The app reads the auth file only when started with `--auth FILE`.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

from annotate.passwords import MIN_PASSWORD_CHARS, AuthFileError, set_password, upgrade_auth_file
from annotate.store import Store
from loop.config import LoopConfig

DEFAULT_AUTH_FILE = Path("data/auth.txt")


def _fail(message: str) -> int:
    print(f"app.py: {message}", file=sys.stderr)
    return 2


def read_new_password(name: str, stdin=None) -> str:
    """Twice with getpass on a terminal; the first line of stdin otherwise (scripts, tests)."""
    stdin = stdin or sys.stdin
    if not stdin.isatty():
        return stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"New password for {name} (at least {MIN_PASSWORD_CHARS} characters): ")
    if getpass.getpass("The same password again: ") != first:
        raise AuthFileError("The two passwords differ: nothing was written.")
    return first


def add_user(args, config: LoopConfig) -> int:
    """`--add-user NAME`: set NAME's password in the auth file (added, or replaced); `--role` also sets their role
    in the database."""
    path = Path(config.serve.auth) if config.serve.auth else DEFAULT_AUTH_FILE
    try:
        password = read_new_password(args.add_user)
        name, replaced = set_password(path, args.add_user, password)
    except AuthFileError as error:
        return _fail(str(error))
    print(f"{'Changed the password of' if replaced else 'Added'} {name} in {path}.")
    if args.role:
        Path(config.app.db).parent.mkdir(parents=True, exist_ok=True)
        with Store(config.app.db) as store:
            store.set_role(name, args.role)
        print(f"{name} is {args.role} in {config.app.db}.")
    if not config.serve.auth:
        print(f"Start the app with --auth {path} so that people sign in with these passwords.")
    return 0


def upgrade_auth(args, config: LoopConfig) -> int:
    """`--upgrade-auth FILE`: rewrite the plain-text passwords of an auth file as scrypt hashes, keeping a backup."""
    path = Path(args.upgrade_auth)
    try:
        upgraded, backup = upgrade_auth_file(path)
    except AuthFileError as error:
        return _fail(str(error))
    if not upgraded:
        print(f"{path} holds no plain-text password: nothing to do.")
        return 0
    print(f"Stored {upgraded} password(s) of {path} as scrypt hashes. The plain-text original is in {backup} "
          "(mode 0600): delete it once people can sign in.")
    return 0
