"""`python app.py` (the default command): start the annotation app in the browser.

This module is the glue between the command line and `build_app`: it refuses unsafe exposure, reads the auth file,
opens the store, seeds an empty database with the shipped prompts, wraps the model as the pair generator (loaded
once, on first use, so the page is up in seconds), and says whether training rounds can be started from the app.
"""

from __future__ import annotations

import argparse
import hmac
import importlib
import ipaddress
import os
import sys
import threading
from pathlib import Path
from typing import Callable

from annotate.importers import PromptImportError
from annotate.rounds_runner import RoundRunner
from annotate.store import Store
from annotate.ui import build_app
from annotate.ui_session import AppConfig, clean_name

PROJECT_ROOT = Path(__file__).resolve().parents[1]
APP_PATH = PROJECT_ROOT / "app.py"
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


def round_command(db: str, model: str) -> list[str] | None:
    """The command that runs one training round, or None while this version has no round command."""
    app = importlib.import_module("app")  # app.py's table of commands says what is built
    target = next((target for flag, _m, _h, target in app.COMMANDS if flag == "--train-round"), None)
    if target is None:
        return None
    return [sys.executable, str(APP_PATH), "--train-round", "--db", str(db), "--model", str(model)]


class ModelPairGenerator:
    """The real generator: the current policy writes pairs through annotate.active_pairs.queue_pairs, so after the
    first round the sample pairs are the ones the last reward model's heads are least sure about, as in the round.

    Models are loaded on first use (the page is up before torch is even imported) and kept: the current policy and,
    for versus pairs, the earlier one it is compared with, and the last round's reward model. After a round records
    a newer policy, the next batch loads it and drops models no longer needed. One batch at a time (GenerationJob);
    the lock guards direct callers. `[votes]` settings come from rlhf-loop.toml as the round started here reads it.
    """

    def __init__(self, store: Store, model_name: str):
        self.store = store
        self.model_name = model_name
        self._lock = threading.Lock()
        self._loaded: dict[int, tuple] = {}  # policy id -> (model, tokenizer)
        self._judge: tuple[str | None, object] = (None, None)  # (reward model path, its TrainedPreferenceModel)

    def _pair_judge(self, votes):
        """The last finished round's reward model, loaded once per round; None before the first round (or when
        votes.oversample <= 2 turns the choice off)."""
        from annotate.active_pairs import load_pair_judge, pair_judge_path

        path = pair_judge_path(self.store) if votes.oversample > 2 else None
        if path != self._judge[0]:
            if path is not None:
                print(f"Choosing sample pairs with the reward model at {path} ...", file=sys.stderr)
            self._judge = (path, load_pair_judge(path, votes))
        return self._judge[1]

    def _load(self, policies: list) -> None:
        from annotate.pairs import load_policy_model

        wanted = {policy.id for policy in policies}
        for policy_id in [pid for pid in self._loaded if pid not in wanted]:
            del self._loaded[policy_id]
        for policy in policies:
            if policy.id not in self._loaded:
                print(f"Loading policy {policy.id} (round {policy.round}) from {policy.path} ...", file=sys.stderr)
                self._loaded[policy.id] = load_policy_model(policy.path)

    def generate(self, n_pairs: int, versus_share: float, progress: Callable[[int, int], None]) -> int:
        from annotate.active_pairs import queue_pairs
        from annotate.pairs import earlier_policy, ensure_base_policy
        from rlhf.config import load_config

        with self._lock:
            votes = load_config().votes
            policy = ensure_base_policy(self.store, self.model_name)
            opponent = earlier_policy(self.store, policy) if versus_share > 0 else None
            self._load([policy] + ([opponent] if opponent else []))
            model, tokenizer = self._loaded[policy.id]
            report = queue_pairs(
                self.store, model, tokenizer, n_pairs, policy.id, votes, judge=self._pair_judge(votes),
                versus_share=versus_share if opponent else 0.0, versus_policy_id=opponent.id if opponent else None,
                versus_model=self._loaded[opponent.id][0] if opponent else None, progress=progress,
            )
            return report.written


def main(args: argparse.Namespace) -> int:
    """Start the app; returns an exit code (2 for a problem the user can fix, printed to stderr)."""
    try:
        check_exposure(args.host, args.share, args.auth)
        passwords = read_auth_file(args.auth) if args.auth else None
        if args.overlap < 1:
            raise ServeError(f"--overlap must be 1 or more, not {args.overlap}.")
        if args.first_batch < 0 or args.auto_round_every < 0:
            raise ServeError("--first-batch and --auto-round-every take 0 or a positive number.")
    except ServeError as error:
        print(f"app.py: {error}", file=sys.stderr)
        return 2
    store = Store(args.db)
    if message := seed_prompts(store):
        print(message, file=sys.stderr)
    runner = RoundRunner(store, round_command(args.db, args.model), cwd=PROJECT_ROOT,
                         auto_every=args.auto_round_every)
    if passwords is not None:
        # People in the auth file exist from the start, so an admin can set roles before they first sign in.
        for name in passwords:
            store.add_annotator(name)
    config = AppConfig(
        guidelines_path=SHIPPED_GUIDELINES, admins=tuple(args.admin), require_auth=passwords is not None,
        overlap=args.overlap, first_batch_pairs=args.first_batch,
    )
    # Gradio recomputes a pandas summary of up to 10,000 recent events after every event (for its monitoring
    # page): with many votes that becomes the largest cost of a vote. Summarise once per 1000 events instead.
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1000")
    demo = build_app(store, ModelPairGenerator(store, args.model), config, runner)
    demo.queue(default_concurrency_limit=None)
    print(f"Annotation app on http://{args.host}:{args.port} (database {args.db}); Ctrl-C stops it.",
          file=sys.stderr)
    demo.launch(
        server_name=args.host, server_port=args.port, share=args.share,
        auth=password_checker(passwords) if passwords is not None else None,
        auth_message="rlhf-loop: sign in with the name and password your admin gave you.",
        quiet=True, footer_links=["gradio"],
    )
    return 0
