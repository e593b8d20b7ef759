"""The next pairs to vote on, chosen to teach the reward model most: one path for the round, the app and
`--generate-pairs`.

Once a round has trained a reward model with bootstrap heads (every strategy saves them) and `votes.oversample` is
above 2, sample pairs come from over-sampled answers: the candidate pairs the heads disagree on most, plus a random
share that keeps the held-out estimate honest (rlhf.active). Versus pairs are made as always. Before the first
round, or with `votes.oversample = 2`, every pair is made by annotate.pairs.make_pairs, two answers a prompt.
"""

from __future__ import annotations

from pathlib import Path

from annotate.pairs import (PairsProgress, PairsReport, _merge_stats, _model_and_tokenizer, make_active_pairs,
                           make_pairs)
from rlhf.generate import AnswerSampling
from rlhf.reward_strategies import HEADS_FILE, VotesConfig


def has_heads(path: str | None) -> bool:
    """Whether `path` is a reward model folder with bootstrap heads (what ranks candidate pairs)."""
    return path is not None and (Path(path) / HEADS_FILE).is_file()


def pair_judge_path(store) -> str | None:
    """The last finished round's reward model folder when it holds bootstrap heads; None before any round."""
    last = store.last_done_round()
    path = last.metrics.get("round/reward_model_path") if last is not None else None
    return path if has_heads(path) else None


def load_pair_judge(path: str | None, votes: VotesConfig):
    """The TrainedPreferenceModel at `path`, whose heads' disagreement ranks candidate pairs; None when there is no
    such model there or when votes.oversample <= 2 turns the choice off."""
    if votes.oversample <= 2 or not has_heads(path):
        return None
    from rlhf.reward_strategies import TrainedPreferenceModel

    return TrainedPreferenceModel.load(path)


def queue_pairs(store, model, tokenizer, n_pairs: int, policy_id: int, votes: VotesConfig, judge=None,
                versus_share: float = 0.0, versus_policy_id: int | None = None, versus_model=None,
                sampling: AnswerSampling | None = None, seed: int | None = None,
                progress: PairsProgress | None = None, show_bar: bool = False) -> PairsReport:
    """Store up to `n_pairs` pairs from policy `policy_id` (a share `versus_share` against an earlier policy) and
    report them; the sample pairs are chosen by `judge` (a TrainedPreferenceModel) when there is one and
    votes.oversample > 2, else drawn at random. report.stats["active/uncertain"] counts the pairs chosen for the
    judge's disagreement. `model` is the policy's model, or a path to load it from once (tokenizer None)."""
    model, tokenizer = _model_and_tokenizer(model, tokenizer)
    if judge is None or votes.oversample <= 2:
        return make_pairs(store, model, tokenizer, n_pairs, policy_id, versus_share=versus_share,
                          versus_policy_id=versus_policy_id, versus_model=versus_model, sampling=sampling, seed=seed,
                          progress=progress, show_bar=show_bar)
    from rlhf.active import choose_pairs

    n_versus = round(n_pairs * versus_share)
    report = PairsReport(policy_id=policy_id)
    if n_versus:
        def versus_progress(done: int, total: int) -> None:
            progress(round(done / max(total, 1) * n_versus), n_pairs)

        versus = make_pairs(store, model, tokenizer, n_versus, policy_id, versus_share=1.0,
                            versus_policy_id=versus_policy_id, versus_model=versus_model, sampling=sampling, seed=seed,
                            progress=versus_progress if progress else None, show_bar=show_bar)
        _add(report, versus)
        report.versus_policy_id = versus.versus_policy_id

    def chooser(prompts, answers, n, choice_seed):
        candidates, selection = choose_pairs(judge, prompts, answers, n, votes.random_share, choice_seed)
        return [(candidates[i].prompt_index, candidates[i].a, candidates[i].b) for i in selection.all], \
            len(selection.uncertain)

    def active_progress(done: int, total: int) -> None:
        progress(n_versus + round(done / max(total, 1) * (n_pairs - n_versus)), n_pairs)

    active = make_active_pairs(store, model, tokenizer, n_pairs - n_versus, policy_id, chooser,
                               per_prompt=votes.oversample, prompts_per_pair=votes.prompts_per_pair, sampling=sampling,
                               seed=seed, progress=active_progress if progress else None, show_bar=show_bar)
    _add(report, active)
    report.stats["active/uncertain"] = active.stats.get("active/uncertain", 0.0)
    report.stats["active/candidate_answers"] = active.stats.get("gen/answers", 0.0)
    return report


def _add(total: PairsReport, part: PairsReport) -> None:
    total.written += part.written
    total.sample += part.sample
    total.versus += part.versus
    total.skipped_identical += part.skipped_identical
    total.skipped_empty += part.skipped_empty
    if part.stats.get("gen/answers"):
        _merge_stats(total.stats, part.stats)
