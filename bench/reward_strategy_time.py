"""Seconds a round's reward stage spends per strategy: train_strategy on N votes of the cached curve answers.

What a round runs (rlhf.reward.strategies.train_strategy with the round's defaults: features, cross-validated head,
bootstrap heads, held-out measurement, and for lpft the fine-tuning), on votes a simulated annotator gives on
bench/curve_data.py's cached answers (no noise: time does not depend on the labels). The model load is not counted.
Ends with one JSON line.

    python bench/reward_strategy_time.py --votes 300,900 --strategies head,lpft --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.simulate import resolve_judge
from bench.curve_data import answers_cache_path, read_answers
from bench.machine import describe_machine, machine_line
from rlhf.reward.active import candidate_pairs
from rlhf.reward.data import PreferencePair
from rlhf.reward.features import FeatureExtractor
from rlhf.reward.strategies import StrategyConfig, VotesConfig, train_strategy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--annotator", default="structured")
    parser.add_argument("--votes", default="300,900", help="vote counts, comma-separated")
    parser.add_argument("--strategies", default="head,lpft")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--finetune-layers", type=int, help="lpft: decoder layers fine-tuned (default: the round's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    rows = read_answers(answers_cache_path(4, args.max_new_tokens, 0))
    if not rows:
        print(f"No cached answers: run python bench/curve_data.py --max-new-tokens {args.max_new_tokens} first.",
              file=sys.stderr)
        return 2
    judge = resolve_judge(args.annotator)
    pairs = []
    for c in candidate_pairs([r["answers"] for r in rows]):
        prompt, a, b = rows[c.prompt_index]["prompt"], rows[c.prompt_index]["answers"][c.a], \
            rows[c.prompt_index]["answers"][c.b]
        verdict = judge(prompt, a, b)
        if verdict != "tie":
            pairs.append(PreferencePair(prompt, a, b) if verdict == "a" else PreferencePair(prompt, b, a))
    votes = VotesConfig() if args.finetune_layers is None else VotesConfig(finetune_layers=args.finetune_layers)
    seconds = {}
    for n in [int(v) for v in args.votes.split(",")]:
        for strategy in args.strategies.split(","):
            extractor = FeatureExtractor.from_model(args.model)  # a fresh feature cache, as a round starts with
            started = time.perf_counter()
            model = train_strategy(strategy, pairs[:n], args.model, StrategyConfig(votes=votes), extractor=extractor)
            seconds.setdefault(strategy, {})[n] = round(time.perf_counter() - started, 1)
            print(f"{strategy:<8} {min(n, len(pairs)):>5} votes: {seconds[strategy][n]:>7.1f} s, held-out "
                  f"{model.metrics.get('rm/heldout_accuracy', float('nan')):.1%}", flush=True)
    print(json.dumps({"bench": "reward_strategy_time", "annotator": args.annotator, "seconds": seconds,
                      "available_votes": len(pairs),
                      "finetune_layers": votes.finetune_layers, "threads": args.threads, "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
