"""The annotation app in the browser, wired to the work beside it (`python app.py`, the default command).

The server never loads a model: pairs and rounds are child processes (`app.py --generate-pairs`, `app.py
--train-round`) that read the same configuration, written once to a file beside the database, so what the app
starts behaves as the same command typed in a shell.
"""

from __future__ import annotations

import os
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


def serve_annotation_app(config: LoopConfig) -> int:
    """Start the app; returns an exit code (2 for a problem the user can fix, printed to stderr)."""
    settings = config.serve
    try:
        check_exposure(settings.host, settings.share, settings.auth)
        passwords = read_auth_file(settings.auth) if settings.auth else None
        if config.app.overlap < 1:
            raise ServeError(f"--overlap must be 1 or more, not {config.app.overlap}.")
    except (ServeError, AuthFileError) as error:
        print(f"app.py: {error}", file=sys.stderr)
        return 2
    for warning in auth_file_warnings(settings.auth, passwords) if passwords is not None else []:
        print(f"app.py: warning: {warning}", file=sys.stderr)
    store = Store(config.app.db)
    for clash in store.name_clashes():
        print(f"app.py: the stored name {clash.name!r} now reads as {clash.normalised!r}, but both voted on pairs "
              f"{list(clash.pairs)}: its votes stay under the old spelling, which nobody can sign in as.",
              file=sys.stderr)
    if message := seed_prompts(store):
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
        overlap=config.app.overlap, first_batch_pairs=settings.first_batch,
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
