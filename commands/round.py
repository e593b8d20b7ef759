"""`python app.py --train-round` and `--demo-loop`: the round and the headless end-to-end demonstration."""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from commands.config import LoopConfig
from rlhf.distributed import is_main_process
from rlhf.round.run import RoundBusy, RoundRefused, run_round

EXIT_REFUSED = 3
EXIT_BUSY = 4
SUMMARY_KEYS = [
    ("rm/heldout_accuracy", "reward model held-out accuracy", "{:.1%}"),
    ("rm/n_heldout_sample", "  on random sample pairs held out", "{:.0f}"),
    ("rm/heldout_accuracy_versus", "  held-out accuracy, versus pairs", "{:.1%}"),
    ("rm/heldout_accuracy_chosen", "  held-out accuracy, chosen pairs", "{:.1%}"),
    ("rm/n_train", "pairs trained on", "{:.0f}"),
    ("ppo/reward", "mean reward (score - KL)", "{:.3f}"),
    ("ppo/score", "mean reward-model score", "{:.3f}"),
    ("ppo/kl", "KL to the reference", "{:.4f}"),
    ("ppo/response_len", "mean answer length (tokens)", "{:.1f}"),
    ("round/policy_id", "new policy", "{}"),
    ("round/pairs_generated", "pairs queued for annotation", "{}"),
    ("round/reward_seconds", "seconds: reward model", "{:.0f}"),
    ("round/ppo_seconds", "seconds: PPO", "{:.0f}"),
    ("round/ceiling_seconds", "seconds: the oracle's ceiling (demo)", "{:.0f}"),
    ("round/pairs_seconds", "seconds: next pairs", "{:.0f}"),
    ("round/seconds", "seconds: the whole round", "{:.0f}"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary_table(metrics: dict) -> str:
    rows = []
    for key, label, fmt in SUMMARY_KEYS:
        value = metrics.get(key)
        if value is not None:
            rows.append(f"  {label:<34} {fmt.format(value)}")
    return "\n".join(rows)


def model_misfit(config: LoopConfig) -> str | None:
    """Why the model cannot run the round with these settings (its context too short for them), or None: checked
    before anything is read, trained or written."""
    from rlhf.models import ModelNotFoundError, check_context

    try:
        check_context(config.app.model,
                      {"[sampling] max_new_tokens": config.sampling.max_new_tokens,
                       "[ppo] max_new_tokens": config.ppo.max_new_tokens},
                      {"[reward] max_length": config.reward.max_length})
    except ModelNotFoundError as error:
        return str(error)
    return None


def train_round(args, config: LoopConfig) -> int:
    """One round; exit 0 done, 2 a model its settings do not fit, 3 refused (too few pairs, reward model below the
    bar), 4 another round running."""
    if (misfit := model_misfit(config)) is not None:
        print(f"error: {misfit}", file=sys.stderr)
        return 2
    Path(config.app.db).parent.mkdir(parents=True, exist_ok=True)
    try:
        result = run_round(config.app.db, config.app.model, config, log=_log)
    except RoundBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except RoundRefused as error:
        print(f"round refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if is_main_process():
        print(f"Round {result.round_id} done.\n{summary_table(result.metrics)}")
    return 0


def comparison_scores(judge, prompts: list[str], new_answers: list[str], first_answers: list[str]) -> list[float]:
    """The judge on each new answer against the first policy's, sides alternated: 1 a win, 0.5 a tie, 0 a loss."""
    scores = []
    for index, (prompt, new, old) in enumerate(zip(prompts, new_answers, first_answers)):
        new_on_a = index % 2 == 0
        verdict = judge(prompt, new, old) if new_on_a else judge(prompt, old, new)
        scores.append(0.5 if verdict == "tie" else 1.0 if verdict == ("a" if new_on_a else "b") else 0.0)
    return scores


def mean_and_standard_error(values: list[float], per_group: int = 1) -> tuple[float | None, float | None]:
    """The mean of `values` and its standard error, the values taken in consecutive groups of `per_group`: the answers
    to one prompt share it, so they are no independent draws, and the standard error is that of the groups' means
    (sample std, n - 1, over sqrt(groups)). (None, None) without values; the error None with fewer than two groups.

    Hand check: [1, 1, 1, 0.5, 0] -> mean 0.7, squared deviations 3 * 0.09 + 0.04 + 0.49 = 0.8, variance 0.8 / 4 = 0.2,
    error sqrt(0.2 / 5) = 0.2. In pairs, [1, 0, 1, 1, 0.5, 0.5, 0, 1] -> means [0.5, 1, 0.5, 0.5], mean 0.625,
    variance (3 * 0.015625 + 0.140625) / 3 = 0.0625, error 0.25 / sqrt(4) = 0.125.
    """
    if not values:
        return None, None
    groups = [values[i:i + per_group] for i in range(0, len(values), per_group)]
    means = [sum(group) / len(group) for group in groups]
    mean = sum(means) / len(means)
    if len(means) < 2:
        return mean, None
    variance = sum((m - mean) ** 2 for m in means) / (len(means) - 1)
    return mean, math.sqrt(variance / len(means))


def win_rate_interval(scores: list[float], per_prompt: int = 1, z: float = 1.96) -> tuple[float, float]:
    """95% interval of the win rate (the mean of 1 win / 0.5 tie / 0 loss): mean +- z standard errors of the prompts'
    mean scores (`mean_and_standard_error`), clipped to [0, 1]; (0, 1) with fewer than two prompts.

    A normal interval on the mean with the scores' own spread, not Wilson's: Wilson takes the variance of a yes/no
    outcome, p(1 - p), which counts a tie as a coin flip between a win and a loss. The rule judges tie often (neither
    answer has a courtesy word), and with ties the spread is smaller than that (all ties: no spread, Wilson +-7% at
    192 comparisons); several answers to one prompt are no independent draws either, which per-prompt means handle
    and Wilson cannot. At 64 or more prompts the mean of scores bounded in [0, 1] is near normal; only at the edges
    (every comparison alike) does the interval close to a point, which the counts beside it show.
    Hand check: [1, 1, 1, 0.5, 0] -> 0.7 +- 1.96 * 0.2 = (0.308, 1.092), clipped to (0.308, 1.0).
    """
    mean, error = mean_and_standard_error(scores, per_prompt)
    if mean is None or error is None:
        return 0.0, 1.0
    return max(0.0, mean - z * error), min(1.0, mean + z * error)


def head_to_head(judge, prompts: list[str], new_answers: list[str], first_answers: list[str],
                 per_prompt: int = 1) -> dict[str, float]:
    """The judge on new against first answers, sides alternated: the win rate (ties half), its 95% interval
    (`win_rate_interval`, `per_prompt` answers to each prompt in a row), wins, losses and ties.

    The counts are reported with the rate because 50% alone cannot tell an even match from all ties.
    """
    scores = comparison_scores(judge, prompts, new_answers, first_answers)
    low, high = win_rate_interval(scores, per_prompt)
    return {"win_rate": sum(scores) / len(scores) if scores else 0.0, "win_rate_low": low, "win_rate_high": high,
            "wins": scores.count(1.0), "losses": scores.count(0.0), "ties": scores.count(0.5)}


def mean_score(score, answers: list[str]) -> float | None:
    """The rule's mean score over the answers; None when the annotator has no score (a module:function verdict)."""
    if score is None or not answers:
        return None
    return sum(score(answer) for answer in answers) / len(answers)


def judged(judge, score, prompts: list[str], answers: list[str], first_answers: list[str],
           per_prompt: int) -> dict:
    """A policy's answers against the first policy's: `head_to_head`, and the rule's mean score of them with its
    standard error (None for an annotator without a score)."""
    judge_score, judge_score_se = (None, None) if score is None else \
        mean_and_standard_error([score(answer) for answer in answers], per_prompt)
    return {**head_to_head(judge, prompts, answers, first_answers, per_prompt), "judge_score": judge_score,
            "judge_score_se": judge_score_se}


def oracle_reward(score, annotator: str):
    """PPO's reward function (texts -> scores) from an annotator's own score of an answer."""
    def reward(texts: list[str]) -> list[float]:
        return [float(score(text)) for text in texts]

    reward.__name__ = f"oracle:{annotator}"
    return reward


def reward_model_means(path: str, prompts: list[str], answer_sets: list[list[str]], max_length: int) -> list[float]:
    """The mean score the reward model at `path` gives each list of answers to `prompts`: beside the judge's score, a
    reward model that rises while the judge does not is being over-optimised (reward hacking)."""
    from rlhf.reward.model import RewardModel, load_reward_tokenizer
    from rlhf.reward.strategies import score_with_reward_model

    model, tokenizer = RewardModel.from_pretrained(path), load_reward_tokenizer(None, path)
    return [float(score_with_reward_model(model, tokenizer, prompts, answers, max_length=max_length).mean())
            for answers in answer_sets]


def _plus_minus(value: float | None, error: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}" + ("" if error is None else f" (SE {error:.4f})")


def round_line(row: dict, first: dict) -> str:
    """The printed line of a demo round: the judge's verdicts and scores, the reward model's, the oracle's."""
    def verdicts(prefix: str) -> str:
        return (f"{row[prefix + 'win_rate']:.1%} (95% CI {row[prefix + 'win_rate_low']:.1%}-"
                f"{row[prefix + 'win_rate_high']:.1%}; {row[prefix + 'wins']} wins, {row[prefix + 'losses']} losses, "
                f"{row[prefix + 'ties']} ties)")

    text = (f"round {row['round']}: rm accuracy {row['rm_accuracy']}, reward {row['reward']}, kl {row['kl']}, "
            f"win rate vs first {verdicts('')}")
    if row["judge_score"] is not None:
        text += (f", judge score {_plus_minus(row['judge_score'], row['judge_score_se'])} "
                 f"(first {_plus_minus(first['judge_score'], first['judge_score_se'])})")
    if row.get("rm_score") is not None:
        text += f", reward-model score {row['rm_score']:.4f} (first {row['rm_score_first']:.4f})"
    if row.get("oracle_win_rate") is not None:
        text += (f"; oracle ceiling: win rate {verdicts('oracle_')}, judge score "
                 f"{_plus_minus(row['oracle_judge_score'], row['oracle_judge_score_se'])}, kl {row['oracle_kl']}")
    if row.get("round_seconds") is not None:
        text += f", the round {row['round_seconds']} s"
    return text + f", {row['seconds']} s with votes and judging"


def own_round_seconds(metrics: dict) -> float | None:
    """Seconds the round itself took (what `--train-round` takes on the same votes): its run less the oracle's ceiling,
    a demo measurement; None for a round a crash left without a time."""
    seconds = metrics.get("round/seconds")
    return None if seconds is None else round(seconds - metrics.get("round/ceiling_seconds", 0.0), 1)


def repeat_each(prompts: list[str], times: int) -> list[str]:
    """Each prompt `times` times in a row: the prompts of `policy_answers`' answers."""
    return [prompt for prompt in prompts for _ in range(times)]


MAX_PAIR_CALLS = 4
"""Calls the demo makes to fill its queue to simulate.votes pairs before a round (each makes at most one a prompt)."""


def demo_loop(args, config: LoopConfig) -> int:
    """simulate -> round, R times, on the shipped prompts; the judge's win rate of each policy against the first, with
    its interval, on the same held-out prompts every round; with simulate.reward = "oracle" PPO chases the annotator's
    own score, and with simulate.oracle_ceiling each round is judged beside PPO on that score from the same policy."""
    from annotate.policy_pairs import load_pair_judge, pair_judge_path, policy_answers, queue_pairs
    from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, resolve_score, simulate_votes
    from annotate.store import Store

    sim = config.simulate
    try:
        judge = resolve_judge(sim.annotator)
    except AnnotatorSpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    score = resolve_score(sim.annotator)
    oracle = None if score is None else oracle_reward(score, sim.annotator)
    if oracle is None and (sim.reward == "oracle" or sim.oracle_ceiling):
        asked = "--reward oracle" if sim.reward == "oracle" else "--oracle-ceiling"
        print(f"error: {asked} rewards PPO with the annotator's own score of each answer, and {sim.annotator!r} has "
              "none: it only judges pairs. Use an annotator with a score (a built-in rule such as courteous, or "
              "contains:WORD) or --reward model.", file=sys.stderr)
        return 2
    if (misfit := model_misfit(config)) is not None:
        print(f"error: {misfit}", file=sys.stderr)
        return 2
    name = sim.annotator_name or f"sim:{sim.annotator}"
    Path(config.app.db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(config.app.db)
    # Seeds go on from the database's rounds: a second invocation on the same database draws new flips and pairs
    rounds_before = len(store.rounds())
    voter = noisy(judge, sim.noise, random.Random(sim.seed + 7 + rounds_before)) if sim.noise else judge
    if store.count_prompts() == 0:
        store.import_prompts(Path("data/prompts.jsonl"))
    first = store.ensure_base_policy(config.app.model)
    # the same prompts every round and every invocation on this database: the seed alone draws them
    rng = random.Random(sim.seed)
    eval_prompts = rng.sample([p.text for p in store.prompts()], min(sim.eval_prompts, store.count_prompts()))
    _log(f"Demo loop: {sim.rounds} rounds, annotator {sim.annotator} (noise {sim.noise:.0%}), "
         f"{sim.votes} votes a round, PPO rewarded by the {'annotator' if sim.reward == 'oracle' else 'reward model'}"
         f"{' beside the oracle ceiling' if sim.oracle_ceiling else ''}, win rate judged on {sim.eval_answers} "
         f"answer(s) to each of {len(eval_prompts)} prompts kept out of PPO ({store.count_prompts() - len(eval_prompts)} "
         "left for it).")
    eval_sampling = replace(config.sampling, seed=sim.seed)
    prompts_each = repeat_each(eval_prompts, sim.eval_answers)
    first_answers = policy_answers(first.path, eval_prompts, eval_sampling, sim.eval_answers)
    first_score = dict(zip(("judge_score", "judge_score_se"), (None, None) if score is None else
                           mean_and_standard_error([score(answer) for answer in first_answers], sim.eval_answers)))
    if score is not None:
        _log(f"The first policy's answers score {_plus_minus(first_score['judge_score'], first_score['judge_score_se'])}"
             f" on average by the {sim.annotator} rule.")

    def judge_policy(path: str) -> tuple[list[str], dict]:
        answers = policy_answers(path, eval_prompts, eval_sampling, sim.eval_answers)
        return answers, judged(judge, score, prompts_each, answers, first_answers, sim.eval_answers)

    rows = []
    for round_number in range(1, sim.rounds + 1):
        started = time.perf_counter()
        # as the app's "generate now": chosen by the last reward model once there is one; a call makes at most one
        # pair a prompt, so asking for more votes than there are prompts takes a second call on the least-used ones
        for call in range(MAX_PAIR_CALLS):
            waiting = store.pairs_waiting()
            if waiting >= sim.votes:
                break
            latest = store.latest_policy()
            judge_path = pair_judge_path(store)
            pair_judge = load_pair_judge(judge_path, config.votes)  # not the annotator: the reward model
            _log(f"Generating {sim.votes - waiting} pairs from policy {latest.id} to vote on"
                 f"{', chosen by the reward model at ' + judge_path if pair_judge is not None else ''}.")
            queue_pairs(store, latest.path, None, sim.votes - waiting, latest.id, config.votes, judge=pair_judge,
                        sampling=config.sampling, seed=sim.seed + rounds_before + round_number + 1000 * call,
                        show_bar=True, exclude_prompts=frozenset(eval_prompts))
            if store.pairs_waiting() == waiting:  # nothing usable came back: vote on what there is
                break
        voted = simulate_votes(store, voter, name, sim.votes, seed=sim.seed + rounds_before + round_number,
                               score=score)  # graded by the rule's score, where it has one
        _log(f"Demo round {round_number} of {sim.rounds}: {name} cast {voted.votes} votes.")
        try:
            result = run_round(config.app.db, config.app.model, config, log=_log, exclude_prompts=set(eval_prompts),
                               reward_function=oracle if sim.reward == "oracle" else None,
                               ceiling_reward=oracle if sim.oracle_ceiling else None)
        except RoundRefused as error:
            print(f"demo round {round_number} of {sim.rounds} refused: {error}", file=sys.stderr)
            break
        new_answers, verdicts = judge_policy(store.policy(result.policy_id).path)
        metrics = result.metrics
        row = {
            "round": result.round_id,  # the database's round: a reused database goes on from its last one
            "rm_accuracy": metrics.get("rm/heldout_accuracy"),
            "reward": metrics.get("ppo/reward"),
            "kl": metrics.get("ppo/kl"),
            **verdicts,
        }
        reward_path = metrics.get("round/reward_model_path")  # absent when a resumed round reused a crashed one's
        row["rm_score"], row["rm_score_first"] = reward_model_means(
            reward_path, prompts_each, [new_answers, first_answers], config.reward.max_length) \
            if reward_path and Path(reward_path).is_dir() else (None, None)
        if sim.oracle_ceiling:  # None when a resumed round never ran it
            ceiling = metrics.get("round/ceiling_policy_path")
            row.update({"oracle_" + key: value for key, value in judge_policy(ceiling)[1].items()} if ceiling else
                       {"oracle_win_rate": None})
            row["oracle_kl"] = metrics.get("ceiling/kl")
        row["round_seconds"] = own_round_seconds(metrics)
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print(round_line(row, first_score), flush=True)
    store.close()
    print(json.dumps({"reward": sim.reward, "eval_prompts": len(eval_prompts), "eval_answers": sim.eval_answers,
                      "first_judge_score": first_score["judge_score"],
                      "first_judge_score_se": first_score["judge_score_se"], "rounds": rows}))
    return 0 if len(rows) == sim.rounds else EXIT_REFUSED
