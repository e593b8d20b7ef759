"""Incremental LP-FT against a full retrain, round by round: held-out accuracy and each round's reward-stage cost.

What a team's rounds do (issue #33): votes arrive `--step` at a time (300: the demo's round). The full retrain is
what votes.incremental = false runs: LP-FT from the probe on every vote so far. The incremental chain is what a round
runs by default: after the first round, LP-FT goes on from the last round's saved model on the new votes plus
votes.replay_share as many earlier ones, votes.incremental_epochs passes (rlhf.reward.strategies.continue_finetuning).
Both are rlhf.reward.strategies.train_strategy("lpft", ...) with the round's other defaults.

Data: bench/curve_data.py's cached answers of the default model (`--answer-seeds 0,1`: 8 answers a prompt), every pair
of distinct answers a candidate. Per (annotator, seed): the prompts the round would hold out (prompt_position below
reward.heldout_fraction, 0.1 by default: a rare split, so `--heldout-fraction` raises it) give the evaluation pairs,
labelled by the rule WITHOUT noise; the others' candidates, shuffled, are the vote stream with `--flip` of them
flipped. Ties are not votes. Accuracy is the share of evaluation pairs ranked right; seconds are wall-clock on one
thread, features excluded (computed once per process, as the round's feature cache does); `finetune_pairs` counts
pairs x passes. Ends with one JSON line.

    python bench/curve_data.py --max-new-tokens 64 --seed 0; python bench/curve_data.py --max-new-tokens 64 --seed 1
    python bench/reward_incremental.py --annotators formal,concise --seeds 2 --sizes 300,600,900,1500 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.simulate import resolve_judge
from bench.machine import describe_machine, machine_line
from bench.reward_curve import pooled_answers
from rlhf.reward.active import candidate_pairs
from rlhf.reward.config import RewardTrainConfig, StrategyConfig, VotesConfig
from rlhf.reward.data import PreferencePair, prompt_position
from rlhf.reward.features import FeatureExtractor
from rlhf.reward.strategies import train_strategy


def vote_stream(rows: list[dict], annotator: str, seed: int, flip: float,
                heldout_fraction: float) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(training votes in the order they arrive, noiseless evaluation pairs of the held-out prompts)."""
    judge = resolve_judge(annotator)
    rng = random.Random(seed)
    stream, evaluation = [], []
    for c in candidate_pairs([r["answers"] for r in rows]):
        prompt = rows[c.prompt_index]["prompt"]
        a, b = rows[c.prompt_index]["answers"][c.a], rows[c.prompt_index]["answers"][c.b]
        verdict = judge(prompt, a, b)
        if verdict == "tie":
            continue
        chosen, rejected = (a, b) if verdict == "a" else (b, a)
        if prompt_position(prompt) < heldout_fraction:
            evaluation.append(PreferencePair(prompt, chosen, rejected))
        else:
            stream.append((prompt, chosen, rejected))
    rng.shuffle(stream)
    votes = [PreferencePair(p, r, c) if rng.random() < flip else PreferencePair(p, c, r) for p, c, r in stream]
    return votes, evaluation


def fitted(pairs, extractor, config: StrategyConfig, evaluation) -> tuple[object, dict]:
    """train_strategy("lpft") on `pairs` (nothing held out of them: `evaluation` measures), timed."""
    started = time.perf_counter()
    model = train_strategy("lpft", pairs, "unused: the extractor is given", config, extractor=extractor)
    seconds = time.perf_counter() - started
    right = model.ranks_right(evaluation)
    return model, {"accuracy": sum(right) / len(right), "seconds": seconds,
                   "finetune_pairs": model.metrics["rm/finetune_pairs"], "n_new": model.metrics.get("rm/n_new")}


def run_one(job: tuple) -> dict:
    """One (annotator, seed): the incremental chain at every step and the full retrain at each of `sizes`."""
    rows, model_name, annotator, seed, sizes, step, flip, heldout_fraction, max_evaluation = job
    torch.set_num_threads(1)
    votes, evaluation = vote_stream(rows, annotator, seed, flip, heldout_fraction)
    evaluation = random.Random(seed).sample(evaluation, min(max_evaluation, len(evaluation)))
    if len(votes) < max(sizes):
        raise SystemExit(f"{annotator}: only {len(votes)} votes for --sizes up to {max(sizes)}: pool more answers")
    extractor = FeatureExtractor.from_model(model_name)
    base = StrategyConfig(votes=VotesConfig(strategy="lpft"), seed=seed,
                          reward=RewardTrainConfig(heldout_fraction=0.0, show_progress=False))
    result = {"annotator": annotator, "seed": seed, "n_evaluation": len(evaluation), "incremental": {}, "full": {}}
    with tempfile.TemporaryDirectory() as folder:
        warm = None
        for n in range(step, max(sizes) + 1, step):
            config = replace(base, seed=seed * 1000 + n, reward=replace(base.reward, warm_start=warm))
            model, figures = fitted(votes[:n], extractor, config, evaluation)
            warm = str(model.save(Path(folder) / f"round-{n}"))
            result["incremental"][n] = figures
            print(f"{annotator} seed {seed} incremental {n}: {figures}", file=sys.stderr, flush=True)
    full = replace(base, votes=replace(base.votes, incremental=False))
    for n in sizes:
        if n == step:  # the first round is a full retrain in both
            result["full"][n] = result["incremental"][n]
            continue
        _, result["full"][n] = fitted(votes[:n], extractor, replace(full, seed=seed * 1000 + n), evaluation)
        print(f"{annotator} seed {seed} full {n}: {result['full'][n]}", file=sys.stderr, flush=True)
    return result


def summary(results: list[dict], sizes: list[int]) -> dict:
    """Per size: mean accuracy and seconds of each arm over the runs, and the mean paired difference with its
    standard error."""
    table = {}
    for n in sizes:
        full = [r["full"][n] for r in results]
        incremental = [r["incremental"][n] for r in results]
        diffs = [i["accuracy"] - f["accuracy"] for i, f in zip(incremental, full)]
        table[n] = {
            "full": statistics.fmean(f["accuracy"] for f in full),
            "incremental": statistics.fmean(i["accuracy"] for i in incremental),
            "difference": statistics.fmean(diffs),
            "difference_se": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
            "full_seconds": statistics.fmean(f["seconds"] for f in full),
            "incremental_seconds": statistics.fmean(i["seconds"] for i in incremental),
            "full_finetune_pairs": statistics.fmean(f["finetune_pairs"] for f in full),
            "incremental_finetune_pairs": statistics.fmean(i["finetune_pairs"] for i in incremental),
            "n_runs": len(results),
        }
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--annotators", default="formal,concise,example", help="held-out rules, comma-separated")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1: "
                        "new seeds extend an earlier run")
    parser.add_argument("--sizes", default="300,600,900,1500", help="vote counts compared, multiples of --step")
    parser.add_argument("--step", type=int, default=300, help="new votes a round")
    parser.add_argument("--flip", type=float, default=0.25, help="share of votes flipped")
    parser.add_argument("--heldout-fraction", type=float, default=0.2, help="share of prompts evaluating")
    parser.add_argument("--max-evaluation", type=int, default=800, help="evaluation pairs drawn (the same for both "
                        "arms: a paired comparison)")
    parser.add_argument("--answer-seeds", default="0,1", help="bench/curve_data.py answer sets pooled per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (one thread each)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(n % args.step for n in sizes):
        parser.error(f"--sizes must be multiples of --step {args.step}")
    print(machine_line(describe_machine()), flush=True)
    rows = pooled_answers(4, args.max_new_tokens, [int(s) for s in args.answer_seeds.split(",")])
    if not rows:
        print("No cached answers: run python bench/curve_data.py --max-new-tokens 64 --seed 0 (and --seed 1) first.",
              file=sys.stderr)
        return 2
    jobs = [(rows, args.model, annotator, seed, sizes, args.step, args.flip, args.heldout_fraction, args.max_evaluation)
            for annotator in args.annotators.split(",")
            for seed in range(args.first_seed, args.first_seed + args.seeds)]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(run_one, jobs)
    else:
        results = [run_one(job) for job in jobs]
    defaults = VotesConfig()
    print(f"LP-FT, {args.flip:.0%} flips, {args.step} new votes a round; incremental: replay_share "
          f"{defaults.replay_share}, {defaults.incremental_epochs} passes; full: {defaults.finetune_epochs} passes")
    print(f"{'annotator':<10} {'seed':>4} {'votes':>5} {'full':>6} {'incr':>6} {'full s':>7} {'incr s':>7}")
    for r in results:
        for n in sizes:
            f, i = r["full"][n], r["incremental"][n]
            print(f"{r['annotator']:<10} {r['seed']:>4} {n:>5} {f['accuracy']:>6.1%} {i['accuracy']:>6.1%} "
                  f"{f['seconds']:>7.0f} {i['seconds']:>7.0f}")
    table = summary(results, sizes)
    for n, row in table.items():
        se = f" (se {row['difference_se']:.1%})" if row["difference_se"] is not None else ""
        print(f"{n} votes: full {row['full']:.1%}, incremental {row['incremental']:.1%}, difference "
              f"{row['difference']:+.1%}{se}; seconds {row['full_seconds']:.0f} against "
              f"{row['incremental_seconds']:.0f}")
    print(json.dumps({"bench": "reward_incremental", "machine": describe_machine(), "flip": args.flip,
                      "step": args.step, "annotators": args.annotators.split(","), "seeds": args.seeds,
                      "first_seed": args.first_seed,
                      "table": table, "runs": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
