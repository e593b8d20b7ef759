"""`python app.py --train-round` and `--demo-loop`: the round and the headless end-to-end demonstration."""

from __future__ import annotations

import json
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
    ("round/seconds", "seconds", "{:.0f}"),
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


def head_to_head(judge, prompts: list[str], new_answers: list[str], first_answers: list[str]) -> dict[str, float]:
    """The judge on new against first answers, sides alternated: wins, losses, ties and the win rate (ties half).

    The counts are reported with the rate because 50% alone cannot tell an even match from all ties.
    """
    counts = {"wins": 0, "losses": 0, "ties": 0}
    for index, (prompt, new, old) in enumerate(zip(prompts, new_answers, first_answers)):
        new_on_a = index % 2 == 0
        verdict = judge(prompt, new, old) if new_on_a else judge(prompt, old, new)
        if verdict == "tie":
            counts["ties"] += 1
        elif verdict == ("a" if new_on_a else "b"):
            counts["wins"] += 1
        else:
            counts["losses"] += 1
    n = sum(counts.values())
    return {"win_rate": (counts["wins"] + 0.5 * counts["ties"]) / n if n else 0.0, **counts}


def mean_score(score, answers: list[str]) -> float | None:
    """The rule's mean score over the answers; None when the annotator has no score (a module:function verdict)."""
    if score is None or not answers:
        return None
    return sum(score(answer) for answer in answers) / len(answers)


def _score_text(value: float | None, first: float | None) -> str:
    return "" if value is None else f", judge score {value:.4f} (first {first:.4f})"


def repeat_each(prompts: list[str], times: int) -> list[str]:
    """Each prompt `times` times in a row: the prompts of `policy_answers`' answers."""
    return [prompt for prompt in prompts for _ in range(times)]


def demo_loop(args, config: LoopConfig) -> int:
    """simulate -> round, R times, on the shipped prompts; the judge's win rate of each policy against the first."""
    from annotate.policy_pairs import load_pair_judge, pair_judge_path, policy_answers, queue_pairs
    from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, resolve_score, simulate_votes
    from annotate.store import Store

    sim = config.simulate
    try:
        judge = resolve_judge(sim.annotator)
    except AnnotatorSpecError as error:
        print(f"error: {error}", file=sys.stderr)
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
    rng = random.Random(sim.seed)
    eval_prompts = rng.sample([p.text for p in store.prompts()], min(sim.eval_prompts, store.count_prompts()))
    _log(f"Demo loop: {sim.rounds} rounds, annotator {sim.annotator} (noise {sim.noise:.0%}), "
         f"{sim.votes} votes a round, win rate judged on {sim.eval_answers} answer(s) to each of "
         f"{len(eval_prompts)} prompts kept out of training.")
    eval_sampling = replace(config.sampling, seed=sim.seed)
    first_answers = policy_answers(first.path, eval_prompts, eval_sampling, sim.eval_answers)
    score = resolve_score(sim.annotator)
    first_score = mean_score(score, first_answers)
    if first_score is not None:
        _log(f"The first policy's answers score {first_score:.4f} on average by the {sim.annotator} rule.")
    rows = []
    for round_number in range(1, sim.rounds + 1):
        started = time.perf_counter()
        waiting = store.pairs_waiting()
        if waiting < sim.votes:  # as the app's "generate now": chosen by the last reward model once there is one
            latest = store.latest_policy()
            judge_path = pair_judge_path(store)
            pair_judge = load_pair_judge(judge_path, config.votes)  # not the annotator: the reward model
            _log(f"Generating {sim.votes - waiting} pairs from policy {latest.id} to vote on"
                 f"{', chosen by the reward model at ' + judge_path if pair_judge is not None else ''}.")
            queue_pairs(store, latest.path, None, sim.votes - waiting, latest.id, config.votes, judge=pair_judge,
                        sampling=config.sampling, seed=sim.seed + rounds_before + round_number, show_bar=True)
        voted = simulate_votes(store, voter, name, sim.votes, seed=sim.seed + rounds_before + round_number)
        _log(f"Demo round {round_number} of {sim.rounds}: {name} cast {voted.votes} votes.")
        try:
            result = run_round(config.app.db, config.app.model, config, log=_log, exclude_prompts=set(eval_prompts))
        except RoundRefused as error:
            print(f"demo round {round_number} of {sim.rounds} refused: {error}", file=sys.stderr)
            break
        new_answers = policy_answers(store.policy(result.policy_id).path, eval_prompts, eval_sampling,
                                     sim.eval_answers)
        row = {
            "round": result.round_id,  # the database's round: a reused database goes on from its last one
            "rm_accuracy": result.metrics.get("rm/heldout_accuracy"),
            "reward": result.metrics.get("ppo/reward"),
            "kl": result.metrics.get("ppo/kl"),
            **head_to_head(judge, repeat_each(eval_prompts, sim.eval_answers), new_answers, first_answers),
            "judge_score": mean_score(score, new_answers),
            "seconds": round(time.perf_counter() - started, 1),
        }
        rows.append(row)
        print(f"round {result.round_id}: rm accuracy {row['rm_accuracy']}, reward {row['reward']}, "
              f"kl {row['kl']}, win rate vs first {row['win_rate']:.1%} ({row['wins']} wins, {row['losses']} losses, "
              f"{row['ties']} ties){_score_text(row['judge_score'], first_score)}, {row['seconds']} s", flush=True)
    store.close()
    print(json.dumps({"first_judge_score": first_score, "rounds": rows}))
    return 0 if len(rows) == sim.rounds else EXIT_REFUSED
