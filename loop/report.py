"""The round report (annotate.round_report): made once for a round from the store and the round's models, kept in
the store, and written as one HTML file (`--report ROUND`).

Its prompts are the caller's, with both policies' answers to them (the demo loop passes its evaluation prompts), or a
seeded draw of round.report_prompts prompts of the store that the round's PPO did not train on, each answered once by
the round's actor (before) and by its new policy (after), sampled with [sampling]. Each answer is scored by the
round's reward model; when its folder is gone the answers carry no scores and the report says so.
"""

from __future__ import annotations

import random
from pathlib import Path

from annotate.metrics import ROUND_ACTOR_POLICY_ID, ROUND_POLICY_ID, ROUND_PPO_PROMPTS, ROUND_REWARD_MODEL_PATH
from annotate.records import Round
from annotate.round_report import (
    ReportAnswer, RoundReport, headline_figures, promotion_text, report_html, round_seconds, round_settings,
    versus_votes, with_votes_now,
)
from annotate.store import Store, now
from loop.config import LoopConfig
from loop.round_plan import Log, round_checkpoint_dir

REPORT_FILE = "report.html"
"""The report's file in the round's checkpoint folder (`--report` without --out)."""


class ReportRefused(ValueError):
    """No report can be made for this round (unknown, or it saved no new policy); the message says which."""


def round_policies(store: Store, round_id: int) -> tuple[Round, int, int]:
    """The round, the policy it started from (its actor) and the one it saved; ReportRefused for an unknown round or
    one that saved no policy."""
    try:
        round_ = store.round(round_id)
    except KeyError:
        raise ReportRefused(f"there is no round {round_id} in {store.path}") from None
    after = ROUND_POLICY_ID.of(round_.metrics)
    if after is None:
        raise ReportRefused(f"round {round_id} did not finish: it saved no new policy (status {round_.status}), so "
                            "there is nothing to compare")
    before = round_.metrics.get(ROUND_ACTOR_POLICY_ID)
    if before is None:  # not recorded: the new policy's parent is the actor it was trained from
        before = store.policy(int(after)).parent_id
    if before is None:
        raise ReportRefused(f"round {round_id} recorded no policy it started from")
    return round_, int(before), int(after)


def report_prompts(store: Store, round_: Round, config: LoopConfig) -> list[str]:
    """round.report_prompts prompts of the store that the round's PPO did not train on, drawn with round.seed + the
    round's id (all of them when there are fewer)."""
    trained = set(round_.metrics.get(ROUND_PPO_PROMPTS) or ())
    candidates = [prompt.text for prompt in store.prompts() if prompt.text not in trained]
    wanted = max(0, config.round.report_prompts)
    return random.Random(config.round.seed + round_.id).sample(candidates, min(wanted, len(candidates)))


def answers_before_and_after(before_path: str, after_path: str, prompts: list[str], config: LoopConfig,
                             seed: int) -> list[tuple[str, str, str]]:
    """(prompt, the actor's answer, the new policy's answer): one answer a prompt each, sampled with [sampling] and
    the same seed."""
    from loop.policies import policy_answers

    before = policy_answers(before_path, prompts, config.sampling, 1, seed, config.pairs.batch_size)
    after = policy_answers(after_path, prompts, config.sampling, 1, seed, config.pairs.batch_size)
    return list(zip(prompts, before, after))


def reward_model_scores(path: str, prompts: list[str], answer_sets: list[list[str]],
                        max_length: int) -> list[list[float]]:
    """The score the reward model at `path` gives each answer of each list of answers to `prompts`."""
    from rlhf.reward.model import RewardModel, load_reward_tokenizer
    from rlhf.reward.strategies import score_with_reward_model

    model, tokenizer = RewardModel.from_pretrained(path), load_reward_tokenizer(None, path)
    return [[float(score) for score in score_with_reward_model(model, tokenizer, prompts, answers,
                                                                max_length=max_length)]
            for answers in answer_sets]


def scored_answers(reward_path: str | None, answers: list[tuple[str, str, str]],
                   max_length: int) -> tuple[tuple[ReportAnswer, ...], str]:
    """(the answers with the reward model's scores, ""); when its folder is gone, (the answers unscored, why)."""
    if not answers:
        return (), ""
    if not reward_path or not Path(reward_path).is_dir():
        why = f"the round's reward model folder {reward_path} is gone" if reward_path else \
            "the round recorded no reward model"
        return tuple(ReportAnswer(prompt, before, after) for prompt, before, after in answers), why
    prompts = [prompt for prompt, _before, _after in answers]
    before_scores, after_scores = reward_model_scores(
        reward_path, prompts, [[before for _p, before, _a in answers], [after for _p, _b, after in answers]],
        max_length)
    return tuple(ReportAnswer(prompt, before, after, before_score, after_score)
                 for (prompt, before, after), before_score, after_score
                 in zip(answers, before_scores, after_scores)), ""


def sampled_answers(store: Store, round_: Round, config: LoopConfig, paths: tuple[str, str],
                    policy_ids: tuple[int, int], log: Log = print) -> tuple[list[tuple[str, str, str]], str]:
    """`report_prompts` answered by both policies (`paths`: the actor's and the new policy's folders), and where the
    prompts came from, in a sentence."""
    prompts, seed = report_prompts(store, round_, config), config.round.seed + round_.id
    if not prompts:
        why = "round.report_prompts is 0" if config.round.report_prompts <= 0 else \
            "every prompt of the database was one the round's PPO trained on"
        return [], f"No prompts answered: {why}."
    log(f"Round {round_.id} report: answering {len(prompts)} prompts with policy {policy_ids[0]} (before) and "
        f"policy {policy_ids[1]} (after).")
    return answers_before_and_after(*paths, prompts, config, seed), (
        f"{len(prompts)} prompts of the database that the round's PPO did not train on, drawn with seed {seed}; each "
        f"answered once by both policies ([sampling], seed {seed}).")


def make_round_report(store: Store, round_id: int, config: LoopConfig,
                      answers: list[tuple[str, str, str]] | None = None, log: Log = print) -> RoundReport:
    """Make the report of round `round_id`, keep it in the store (replacing an earlier one) and return it.

    `answers`: (prompt, the actor's answer, the new policy's answer) to report, as the demo loop has them for its
    evaluation prompts; None draws round.report_prompts prompts PPO did not train on (`report_prompts`) and answers
    them with both policies. Raises ReportRefused for an unknown round, one that saved no policy, or, without
    `answers`, one whose policies' folders were pruned (loop.retention).
    """
    round_, before_id, after_id = round_policies(store, round_id)
    before_path, after_path = store.policy(before_id).path, store.policy(after_id).path
    if answers is None:
        for policy in (store.policy(before_id), store.policy(after_id)):
            if policy.pruned:
                raise ReportRefused(f"round {round_id}'s report cannot be made again: {policy.pruned_sentence()}")
        answers, source = sampled_answers(store, round_, config, (before_path, after_path), (before_id, after_id), log)
    else:
        source = f"{len(answers)} prompts given with both policies' answers (the demo loop's evaluation prompts)."
    scored, unscored = scored_answers(round_.metrics.get(ROUND_REWARD_MODEL_PATH), answers, config.reward.max_length)
    made_at = now()
    report = RoundReport(
        round_id=round_id, before_policy_id=before_id, after_policy_id=after_id, answers=scored,
        versus=versus_votes(store.versus_win_rates(), after_id, before_id, made_at),
        figures=headline_figures(round_.metrics),
        settings=round_settings(round_.metrics, f"policy {before_id}: {before_path}",
                                f"policy {after_id}: {after_path}"),
        seconds=round_seconds(round_.metrics), prompts_from=source, unscored=unscored, made_at=made_at,
        finished_at=round_.finished_at, promotion=promotion_text(round_.metrics),
    )
    store.save_round_report(round_id, report.to_dict())
    log(f"Round {round_id} report: {len(scored)} prompts answered before and after, kept in {store.path}.")
    return report


def kept_or_made_report(store: Store, round_id: int, config: LoopConfig, log: Log = print) -> RoundReport:
    """The report the store keeps for the round, its versus votes counted again (they arrive after the round); made
    and kept (`make_round_report`) when there is none yet."""
    kept = store.round_report(round_id)
    if kept is None:
        return make_round_report(store, round_id, config, log=log)
    return with_votes_now(RoundReport.from_dict(kept), store.versus_win_rates(), now())


def report_file(config: LoopConfig, round_id: int) -> Path:
    """Where `--report` writes the round's page without --out: <round.checkpoints_dir>/<db name>/round-N/report.html."""
    return round_checkpoint_dir(config.round.checkpoints_dir, config.app.db, round_id) / REPORT_FILE


def write_report_html(report: RoundReport, path: str | Path) -> Path:
    """Write the report's page (annotate.round_report.report_html) to `path`, its folder created; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(report), encoding="utf-8")
    return path
