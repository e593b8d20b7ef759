"""A batch of pairs from the current policy, for `--generate-pairs N` and the app's pair child (`--progress-lines`):
the base model, recorded as round 0, when the store has no policy yet; sample pairs chosen by the last round's reward
model once there is one."""

from __future__ import annotations

import sys

from annotate.metrics import GEN_FINISHED_SHARE, GEN_MEAN_TOKENS, GEN_TOKENS_PER_S, TIME_GENERATE_S
from annotate.promotion import refresh_promotions
from annotate.store import Store
from loop.children.pair_child import ChildLines
from loop.config import LoopConfig
from loop.pair_request import PairBar, PairProgress, PairRequest


class _SharingTheCpu(PairProgress):
    """`progress`, and after each decoding step a ThreadGovernor (rlhf.cpu_threads), which leaves a core to other busy
    programs (the app's web server among them) and takes it back when they are quiet."""

    def __init__(self, progress: PairProgress):
        from rlhf.cpu_threads import ThreadGovernor

        self.progress, self.governor = progress, ThreadGovernor()

    def stage(self, text: str) -> None:
        self.progress.stage(text)

    def pairs(self, done: int, total: int, written: int) -> None:
        self.progress.pairs(done, total, written)

    def answers(self, done: int, planned: int) -> None:
        self.progress.answers(done, planned)

    def step(self, step: int, most: int) -> None:
        self.progress.step(step, most)
        self.governor(step, most)


class _TerminalProgress(PairBar):
    """The terminal's progress: a bar of the pairs, and what is being done as a line."""

    def stage(self, text: str) -> None:
        print(f"{text[0].upper()}{text[1:]}...", file=sys.stderr)


def _candidate_note(current, newest) -> str:
    """What the versus pairs judge when the newest policy is a candidate, not the current one; "" when it is current."""
    if newest.id == current.id:
        return ""
    return f" (policy {newest.id} of round {newest.round}, a candidate not promoted, against its parent)"


def generate_pair_batch(config: LoopConfig, n_pairs: int, versus_share: float, progress_lines: bool = False) -> int:
    """Up to `n_pairs` pairs from the current policy into config.app.db, a share `versus_share` of them versus pairs;
    with `progress_lines` the child protocol's lines on stdout (loop.children.pair_child) instead of a progress bar.
    Returns an exit code: 0 done, 2 a problem the user can fix (said on stderr)."""
    from loop.pairs import queue_pairs
    from loop.policies import load_pair_judge, load_policy_model, pair_judge_path
    from loop.retention import PolicyPruned, loadable_path
    from rlhf.models import ModelNotFoundError, needs_conversion

    sampling, votes, db = config.sampling, config.votes, config.app.db
    lines = ChildLines() if progress_lines else None
    progress = lines or _TerminalProgress()
    with Store(db) as store:
        if store.count_prompts() == 0:
            print(f"app.py --generate-pairs: {db} holds no prompts yet. Import some first, for example the shipped "
                  "ones: python app.py --import-prompts data/prompts.jsonl", file=sys.stderr)
            return 2
        # the votes since the round may promote or hold back its policy
        refresh_promotions(store, config.promotion, config.votes.weighting)
        policy, newest = store.ensure_base_policy(config.app.model), store.latest_policy()
        print(f"Generating {n_pairs} pairs from policy {policy.id} (round {policy.round}, {policy.path}), "
              f"{versus_share:.0%} versus pairs{_candidate_note(policy, newest)}, up to {sampling.max_new_tokens} "
              f"tokens an answer at temperature {sampling.temperature}.", file=sys.stderr)
        judge_path = pair_judge_path(store)
        judge = load_pair_judge(judge_path, votes)
        if judge is not None:
            print(f"Sample pairs: the {votes.oversample} answers a prompt that the reward model at {judge_path} is "
                  f"least sure about ({votes.random_share:.0%} at random).", file=sys.stderr)
        progress.stage("converting the default model from GGUF, once (about 30 s)" if needs_conversion(policy.path)
                       else "loading the model")
        try:
            model = load_policy_model(loadable_path(policy))
            if next(model.model.parameters()).device.type == "cpu":
                progress = _SharingTheCpu(progress)
            progress.stage("generating")
            request = PairRequest(n_pairs, policy.id, versus_share=versus_share, versus_newer_id=newest.id,
                                  sampling=sampling, seed=config.pairs.seed, batch_size=config.pairs.batch_size)
            report = queue_pairs(store, request, votes, judge=judge, model=model, progress=progress)
        except (ModelNotFoundError, PolicyPruned) as error:
            print(f"app.py --generate-pairs: {error}", file=sys.stderr)
            return 2
        stats = report.stats
        print(f"{report.written} pairs written ({report.sample} sample, {report.versus} versus); skipped "
              f"{report.skipped_identical} with identical and {report.skipped_empty} with empty answers. "
              f"{stats.get(GEN_FINISHED_SHARE, 0.0):.0%} of answers finished, "
              f"{stats.get(GEN_MEAN_TOKENS, 0.0):.0f} tokens on average, "
              f"{stats.get(GEN_TOKENS_PER_S, 0.0):.1f} tokens/s, {stats.get(TIME_GENERATE_S, 0.0):.0f} s. "
              f"{store.pairs_waiting()} pairs wait for votes.", file=sys.stderr if lines else sys.stdout)
    if lines:
        lines.written(report.written)
    return 0
