"""The annotation app in the browser, wired to the work beside it (`python app.py`, the default command).

The server never loads a model: pairs and rounds are child processes (`app.py --generate-pairs`, `app.py
--train-round`) that read the same configuration, written once to a file beside the database, so what the app
starts behaves as the same command typed in a shell.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from pathlib import Path

from starlette.middleware import Middleware

from annotate.passwords import (
    AuthFileError, ClientAddressMiddleware, auth_file_warnings, password_checker, read_auth_file,
)
from annotate.serve import SHIPPED_GUIDELINES, ServeError, check_exposure, seed_prompts
from annotate.store import Store
from annotate.ui import build_app
from annotate.ui_session import AppConfig
from loop.children.pair_child import ChildProcessPairGenerator
from loop.children.pair_job import GenerationJob
from loop.children.round_runner import RoundRunner
from loop.config import LoopConfig
from loop.config_files import config_as_toml, unset_overrides
from loop.file_lock import AppLock, FileLock, LockHeld
from loop.round_plan import database_checkpoint_dir

APP_PATH = Path(__file__).resolve().parents[1] / "app.py"
AUTH_MESSAGE = ("rlhf-loop: sign in with the name and password your admin gave you. If you were signed in, the app "
                "restarted or the browser was closed: sign in again. After 5 wrong passwords for a name, "
                "each further try waits longer.")


def write_child_config(config: LoopConfig) -> Path:
    """The effective configuration as TOML beside the database: the children the app starts read it (--config)."""
    path = Path(f"{config.app.db}.serve.toml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by the annotation app at start: the settings its rounds and pair making use.\n"
                    + config_as_toml(config), encoding="utf-8")
    return path


def child_command(config_file: Path, config: LoopConfig, *command: str) -> list[str]:
    """`python app.py COMMAND... --config FILE [--set KEY=none ...]`: a child of the app with the app's own
    configuration (FILE from write_child_config)."""
    unset = [argument for override in unset_overrides(config) for argument in ("--set", override)]
    return [sys.executable, str(APP_PATH), *command, "--config", str(config_file), *unset]


def check_port(host: str, port: int) -> None:
    """ServeError, saying what to do, unless the app could listen on (host, port) now: a socket is bound there and
    closed again (with SO_REUSEADDR, as the server's own, so a port its last run left in TIME_WAIT counts as free)."""
    if not 1 <= port <= 65535:
        raise ServeError(f"--port must be a number from 1 to 65535, not {port}.")
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                 flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except PermissionError:
        raise ServeError(f"port {port} on {host} needs more rights than this user has (ports below 1024 usually do); "
                         "start with --port N, N from 1024 up") from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use (by another program); start with --port N or stop "
                             "that program") from None
        raise ServeError(f"the app cannot listen on {host} ({error.strerror or error}); start with --host set to an "
                         "address of this machine, such as the default 127.0.0.1") from None


def second_app_refusal(lock: FileLock, db: str) -> ServeError:
    """The refusal of an app started on a database that another app serves, naming the other's process and port."""
    try:
        holder = json.loads(lock.holder())
    except ValueError:
        holder = {}
    holder = holder if isinstance(holder, dict) else {}
    return ServeError(f"another annotation app (process {holder.get('pid', '?')}, port {holder.get('port', '?')}) "
                      f"serves {db}; open that one, or stop it first")


def claim_database(db: str, host: str, port: int) -> FileLock:
    """The app's lock on its database (`<db>.app.lock`, holding its pid and port), taken after the port was found
    free and before anything else is written: one app per database, since each app keeps its reservations of pairs
    in its own memory. ServeError, saying what to do, when another app holds it or the port is not free."""
    lock = AppLock(db)
    if lock.is_held():  # before the port: a second app on the default port is best told about the first app
        raise second_app_refusal(lock, db)
    check_port(host, port)
    try:
        return lock.acquire(json.dumps({"pid": os.getpid(), "host": host, "port": port}))
    except LockHeld:
        raise second_app_refusal(lock, db) from None


def serve_annotation_app(config: LoopConfig) -> int:
    """Start the app; returns an exit code (2 for a problem the user can fix, printed to stderr)."""
    settings = config.serve
    try:
        check_exposure(settings.host, settings.share, settings.auth)
        passwords = read_auth_file(settings.auth) if settings.auth else None
        if config.app.overlap < 1:
            raise ServeError(f"--overlap must be 1 or more, not {config.app.overlap}.")
        app_lock = claim_database(config.app.db, settings.host, settings.port)
    except (ServeError, AuthFileError) as error:
        print(f"app.py: {error}", file=sys.stderr)
        return 2
    try:
        return launch_app(config, passwords)
    finally:
        app_lock.release()


def launch_app(config: LoopConfig, passwords: dict[str, str] | None) -> int:
    """The app on its database, once serve_annotation_app checked its settings and took the database's lock: blocks
    until the server stops."""
    settings = config.serve
    for warning in auth_file_warnings(settings.auth, passwords) if passwords is not None else []:
        print(f"app.py: warning: {warning}", file=sys.stderr)
    store = Store(config.app.db)
    for clash in store.name_clashes():
        print(f"app.py: the stored name {clash.name!r} now reads as {clash.normalised!r}, but both voted on pairs "
              f"{list(clash.pairs)}: its votes stay under the old spelling, which nobody can sign in as.",
              file=sys.stderr)
    if message := seed_prompts(store, max_prompt_chars=config.app.max_prompt_chars):
        print(message, file=sys.stderr)
    config_file = write_child_config(config)
    runner = RoundRunner(store, child_command(config_file, config, "--train-round"), cwd=os.getcwd(),
                         auto_every=settings.auto_round_every)
    generator = ChildProcessPairGenerator(
        lambda n_pairs, versus_share: child_command(config_file, config, "--generate-pairs", str(n_pairs),
                                                    "--versus-share", str(versus_share), "--progress-lines"),
        cwd=os.getcwd())
    if passwords is not None:
        # People in the auth file exist from the start, so an admin can set roles before they first sign in.
        for name in passwords:
            store.add_annotator(name)
    app_config = AppConfig(
        guidelines_path=SHIPPED_GUIDELINES, admins=tuple(settings.admins), require_auth=passwords is not None,
        overlap=config.app.overlap, gold_share=config.app.gold_share, first_batch_pairs=settings.first_batch,
        max_prompt_chars=config.app.max_prompt_chars, max_answer_chars=config.app.max_answer_chars,
        checkpoints_dir=database_checkpoint_dir(config.round.checkpoints_dir, config.app.db),
        promotion=config.promotion, weighting=config.votes.weighting,
    )
    # Gradio recomputes a pandas summary of up to 10,000 recent events after every event (for its monitoring
    # page): with many votes that becomes the largest cost of a vote. Summarise once per 1000 events instead.
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1000")
    demo = build_app(store, GenerationJob(generator), runner, app_config)
    demo.queue(default_concurrency_limit=None)
    print(f"Annotation app on http://{settings.host}:{settings.port} (database {config.app.db}); Ctrl-C stops it.",
          file=sys.stderr)
    demo.launch(
        server_name=settings.host, server_port=settings.port, share=settings.share,
        auth=password_checker(passwords) if passwords is not None else None, auth_message=AUTH_MESSAGE,
        # the client's address for the sign-in back-off (Gradio passes the auth function no request)
        app_kwargs={"middleware": [Middleware(ClientAddressMiddleware)]},
        quiet=True, footer_links=["gradio"],
    )
    return 0
