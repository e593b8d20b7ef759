"""`python app.py --generate-pairs N`: pairs from the current policy, with [sampling] and [votes] of the one
configuration; the annotation app runs the same command as a child process (`--progress-lines`), so the web server
never loads a model."""

from __future__ import annotations

import sys
import time

from annotate.generation_job import ANSWERS_PREFIX, PROGRESS_PREFIX, STAGE_PREFIX, STEP_PREFIX, WRITTEN_PREFIX
from commands.config import LoopConfig


def _fail(message: str) -> int:
    print(f"app.py --generate-pairs: {message}", file=sys.stderr)
    return 2


def print_progress(done: int, total: int) -> None:
    print(f"{PROGRESS_PREFIX} {int(done)} {int(total)}", flush=True)


def print_answers(done: int, planned: int) -> None:
    print(f"{ANSWERS_PREFIX} {int(done)} {int(planned)}", flush=True)


def print_stage(text: str) -> None:
    print(f"{STAGE_PREFIX} {text}", flush=True)


class StepPrinter:
    """Prints `pairs-step STEP MOST SECONDS_PER_STEP` about once a second: where the batch being decoded is, and its
    pace, from which the app bounds the wait for the first pair before any answer has ended."""

    def __init__(self, every_s: float = 1.0, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.batch_began = self.last_printed = None
        self.first_step = 1

    def __call__(self, step: int, most: int) -> None:
        now = self.clock()
        if step == 1 or self.batch_began is None:  # a new batch
            self.batch_began, self.first_step = now, step
            return
        if self.last_printed is None or now - self.last_printed >= self.every_s:
            self.last_printed = now
            seconds_per_step = (now - self.batch_began) / max(step - self.first_step, 1)
            print(f"{STEP_PREFIX} {step} {most} {seconds_per_step:.4f}", flush=True)


def _decoding_watchers(model, printer: StepPrinter | None):
    """What follows each decoding step: the step printer, and on a CPU a ThreadGovernor (rlhf.cpu_threads), which leaves
    a core to other busy programs (the app's web server among them) and takes it back when they are quiet."""
    from rlhf.cpu_threads import ThreadGovernor

    watchers = [printer] if printer is not None else []
    if next(model.parameters()).device.type == "cpu":
        watchers.append(ThreadGovernor())
    if not watchers:
        return None

    def after_step(step: int, most: int) -> None:
        for watcher in watchers:
            watcher(step, most)

    return after_step


def generate_pairs(args, config: LoopConfig) -> int:
    """N pairs from the current policy (the base model, then recorded as round 0, when the store has no policy yet);
    sample pairs chosen by the last round's reward model once there is one."""
    from annotate.policy_pairs import load_pair_judge, load_policy_model, pair_judge_path, queue_pairs
    from annotate.store import Store
    from rlhf.models import ModelNotFoundError, needs_conversion

    try:
        n_pairs = int(args.generate_pairs)
    except ValueError:
        n_pairs = 0
    if n_pairs < 1:
        return _fail(f"N must be a positive whole number (pairs to generate), not {args.generate_pairs!r}.")
    versus_share = args.versus_share
    if not 0.0 <= versus_share <= 1.0:
        return _fail(f"--versus-share must lie between 0 and 1 (the share of versus pairs), not {versus_share}.")
    sampling, votes, db = config.sampling, config.votes, config.app.db
    with Store(db) as store:
        if store.count_prompts() == 0:
            return _fail(f"{db} holds no prompts yet. Import some first, for example the shipped ones: "
                         "python app.py --import-prompts data/prompts.jsonl")
        policy = store.ensure_base_policy(config.app.model)
        print(f"Generating {n_pairs} pairs from policy {policy.id} (round {policy.round}, {policy.path}), "
              f"{versus_share:.0%} versus pairs, up to {sampling.max_new_tokens} tokens an answer at temperature "
              f"{sampling.temperature}.", file=sys.stderr)
        judge_path = pair_judge_path(store)
        judge = load_pair_judge(judge_path, votes)
        if judge is not None:
            print(f"Sample pairs: the {votes.oversample} answers a prompt that the reward model at {judge_path} is "
                  f"least sure about ({votes.random_share:.0%} at random).", file=sys.stderr)
        lines = args.progress_lines
        stage = print_stage if lines else (lambda text: print(f"{text[0].upper()}{text[1:]}...", file=sys.stderr))
        stage("converting the default model from GGUF, once (about 30 s)" if needs_conversion(policy.path)
              else "loading the model")
        try:
            model, tokenizer = load_policy_model(policy.path)
            steps = _decoding_watchers(model, StepPrinter() if lines else None)
            stage("generating")
            report = queue_pairs(store, model, tokenizer, n_pairs, policy.id, votes, judge=judge,
                                 versus_share=versus_share, sampling=sampling, show_bar=not lines,
                                 progress=print_progress if lines else None, answers=print_answers if lines else None,
                                 steps=steps)
        except ModelNotFoundError as error:
            return _fail(str(error))
        stats = report.stats
        print(f"{report.written} pairs written ({report.sample} sample, {report.versus} versus); skipped "
              f"{report.skipped_identical} with identical and {report.skipped_empty} with empty answers. "
              f"{stats.get('gen/finished_share', 0.0):.0%} of answers finished, "
              f"{stats.get('gen/mean_tokens', 0.0):.0f} tokens on average, "
              f"{stats.get('gen/tokens_per_s', 0.0):.1f} tokens/s, {stats.get('time/generate_s', 0.0):.0f} s. "
              f"{store.pairs_waiting()} pairs wait for votes.", file=sys.stderr if args.progress_lines else sys.stdout)
    if args.progress_lines:
        print(f"{WRITTEN_PREFIX} {report.written}", flush=True)
    return 0
