"""`python app.py --train-round` and `--demo-loop`: the round and the headless end-to-end demonstration."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from rlhf.config import ConfigError, LoopConfig, load_config
from rlhf.round import RoundBusy, RoundRefused, run_round

EXIT_REFUSED = 3
EXIT_BUSY = 4
SUMMARY_KEYS = [
    ("rm/heldout_accuracy", "reward model held-out accuracy", "{:.1%}"),
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


def loop_config(args) -> LoopConfig:
    return load_config(getattr(args, "config", None), getattr(args, "set", None) or [])


def summary_table(metrics: dict) -> str:
    rows = []
    for key, label, fmt in SUMMARY_KEYS:
        value = metrics.get(key)
        if value is not None:
            rows.append(f"  {label:<34} {fmt.format(value)}")
    return "\n".join(rows)


def command_train_round(args) -> int:
    """One round; exit 0 done, 3 refused (too few pairs, reward model below the bar), 4 another round running."""
    try:
        config = loop_config(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    try:
        result = run_round(args.db, args.model, config, log=_log)
    except RoundBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except RoundRefused as error:
        print(f"round refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    from accelerate.state import PartialState

    if PartialState().is_main_process:
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


def policy_answers(policy_path: str, prompts: list[str], sampling, per_prompt: int) -> list[str]:
    """`per_prompt` sampled answers to each prompt, prompt by prompt (the order of `repeat_each(prompts, per_prompt)`)."""
    from annotate.pairs import load_policy_model
    from rlhf.generate import generate_answers

    model, tokenizer = load_policy_model(policy_path)
    generated = generate_answers(model, tokenizer, prompts, n_per_prompt=per_prompt, sampling=sampling)
    return [answer.text for answers in generated.answers for answer in answers]


def repeat_each(prompts: list[str], times: int) -> list[str]:
    """Each prompt `times` times in a row: the prompts of `policy_answers`' answers."""
    return [prompt for prompt in prompts for _ in range(times)]


def command_demo_loop(args) -> int:
    """simulate -> round, R times, on the shipped prompts; the judge's win rate of each policy against the first."""
    from annotate.active_pairs import load_pair_judge, pair_judge_path, queue_pairs
    from annotate.pairs import ensure_base_policy
    from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, resolve_score, simulate_votes
    from annotate.store import Store

    try:
        config = loop_config(args)
        judge = resolve_judge(args.annotator)
    except (ConfigError, AnnotatorSpecError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.eval_answers < 1 or args.eval_prompts < 1:
        print(f"error: --eval-prompts and --eval-answers must be at least 1 (got {args.eval_prompts} and "
              f"{args.eval_answers}): the win rate needs answers to judge", file=sys.stderr)
        return 2
    name = args.annotator_name or f"sim:{args.annotator}"
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(args.db)
    # Seeds go on from the database's rounds: a second invocation on the same database draws new flips and pairs
    rounds_before = len(store.rounds())
    voter = noisy(judge, args.noise, random.Random(args.seed + 7 + rounds_before)) if args.noise else judge
    if store.count_prompts() == 0:
        store.import_prompts(Path("data/prompts.jsonl"))
    first = ensure_base_policy(store, args.model)
    rng = random.Random(args.seed)
    eval_prompts = rng.sample([p.text for p in store.prompts()], min(args.eval_prompts, store.count_prompts()))
    _log(f"Demo loop: {args.rounds} rounds, annotator {args.annotator} (noise {args.noise:.0%}), "
         f"{args.votes} votes a round, win rate judged on {args.eval_answers} answer(s) to each of "
         f"{len(eval_prompts)} prompts kept out of training.")
    eval_sampling = replace(config.sampling, seed=args.seed)
    first_answers = policy_answers(first.path, eval_prompts, eval_sampling, args.eval_answers)
    score = resolve_score(args.annotator)
    first_score = mean_score(score, first_answers)
    if first_score is not None:
        _log(f"The first policy's answers score {first_score:.4f} on average by the {args.annotator} rule.")
    rows = []
    for round_number in range(1, args.rounds + 1):
        started = time.perf_counter()
        waiting = store.pairs_waiting()
        if waiting < args.votes:  # as the app's "generate now": chosen by the last reward model once there is one
            latest = store.latest_policy()
            judge_path = pair_judge_path(store)
            pair_judge = load_pair_judge(judge_path, config.votes)  # not the annotator: the reward model
            _log(f"Generating {args.votes - waiting} pairs from policy {latest.id} to vote on"
                 f"{', chosen by the reward model at ' + judge_path if pair_judge is not None else ''}.")
            queue_pairs(store, latest.path, None, args.votes - waiting, latest.id, config.votes, judge=pair_judge,
                        sampling=config.sampling, seed=args.seed + rounds_before + round_number, show_bar=True)
        voted = simulate_votes(store, voter, name, args.votes, seed=args.seed + rounds_before + round_number)
        _log(f"Demo round {round_number} of {args.rounds}: {name} cast {voted.votes} votes.")
        try:
            result = run_round(args.db, args.model, config, log=_log, exclude_prompts=set(eval_prompts))
        except RoundRefused as error:
            print(f"demo round {round_number} of {args.rounds} refused: {error}", file=sys.stderr)
            break
        new_answers = policy_answers(store.policy(result.policy_id).path, eval_prompts, eval_sampling,
                                     args.eval_answers)
        row = {
            "round": result.round_id,  # the database's round: a reused database goes on from its last one
            "rm_accuracy": result.metrics.get("rm/heldout_accuracy"),
            "reward": result.metrics.get("ppo/reward"),
            "kl": result.metrics.get("ppo/kl"),
            **head_to_head(judge, repeat_each(eval_prompts, args.eval_answers), new_answers, first_answers),
            "judge_score": mean_score(score, new_answers),
            "seconds": round(time.perf_counter() - started, 1),
        }
        rows.append(row)
        print(f"round {result.round_id}: rm accuracy {row['rm_accuracy']}, reward {row['reward']}, "
              f"kl {row['kl']}, win rate vs first {row['win_rate']:.1%} ({row['wins']} wins, {row['losses']} losses, "
              f"{row['ties']} ties){_score_text(row['judge_score'], first_score)}, {row['seconds']} s", flush=True)
    store.close()
    print(json.dumps({"first_judge_score": first_score, "rounds": rows}))
    return 0 if len(rows) == args.rounds else EXIT_REFUSED
