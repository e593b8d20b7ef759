"""LP-FT against the head: a linear probe, then fine-tuning of the feature's last decoder layer, from few votes.

The head reward model is a Bradley-Terry head on `mean@L` (the mean over the answer's tokens of layer L's output,
frozen). LP-FT (Kumar et al. 2022; rlhf/reward/lpft.py, the round's "lpft" strategy) starts from that fitted head
(the linear probe) and then fine-tunes decoder layer L, the last one the feature reads, under it by Adam with the
head's own loss (Bradley-Terry, graded votes with the round's margin); the head and the layers below stay frozen.
This sweeps the step and the epochs: accuracy after every epoch of one run.

Splits, votes, flips and evaluation are bench/reward_curve.py's (same seeds, same held-out prompts, noiseless
labels), so the `head` column is that bench's `head:mean@L` with the same --graded variant. Accuracy is printed after
every epoch; pick the epoch count and step on the tuning annotators, then run the held-out ones with them fixed.
Ends with one JSON line.

    python bench/reward_lpft.py --annotator structured --votes 200 --lrs 1e-4,3e-4 --epochs 8 --seeds 6 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from annotate.simulate import resolve_judge, resolve_score
from bench.machine import describe_machine, machine_line
from bench.reward_curve import CurveData, accuracy, fit, load_features, pooled_answers, split
from rlhf.reward.features import FeatureExtractor


def finetune_curve(data: CurveData, votes: list[int], labels: dict[int, bool], strategy: str,
                   evaluation: list[int], lr: float, epochs: int, seed: int) -> list[float]:
    """Held-out accuracy after each epoch of the round's LP-FT (reward_curve's lpft strategy) at step `lr`."""
    data.finetune = {**data.finetune, "finetune_lr": lr, "finetune_epochs": epochs}
    curve = []
    fit(data, strategy.replace("head:", "lpft:", 1), votes, labels, seed,
        on_epoch=lambda epoch, loss, model: curve.append(accuracy(data, strategy, model, evaluation)))
    return curve


def run_seed(data: CurveData, seed: int, n_votes: int, strategy: str, flip: float, lrs: list[float],
             epochs: int) -> dict:
    """reward_curve.run_seed's split and votes, then the head and its fine-tunings."""
    evaluation, _, labels, order = split(data, seed, flip)
    votes = [i for i in order if i in labels][:n_votes]
    weight, _ = fit(data, strategy, votes, labels, seed)
    result = {"head": accuracy(data, strategy, weight, evaluation), "n_votes": len(votes)}
    started = time.perf_counter()
    result["lpft"] = {str(lr): finetune_curve(data, votes, labels, strategy, evaluation, lr, epochs, seed)
                      for lr in lrs}
    result["seconds_per_fit"] = (time.perf_counter() - started) / len(lrs)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--annotator", default="structured")
    parser.add_argument("--flip", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--votes", type=int, default=200)
    parser.add_argument("--layer", type=int, default=2, help="the feature mean@L; decoder layer L is fine-tuned")
    parser.add_argument("--graded", default="margin:4", help="a reward_curve.py --graded variant (the round's default)")
    parser.add_argument("--lrs", default="1e-4,3e-4", help="Adam steps to sweep, comma-separated")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--finetune-layers", type=int,
                        help="decoder layers fine-tuned, the top ones (default: the round's)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=1, help="seeds in parallel processes (one thread each)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    rows = pooled_answers(4, args.max_new_tokens, [0])
    index, features = load_features(rows, args.model, f"{Path(str(args.model)).name}-t{args.max_new_tokens}")
    strategy = f"head:mean@{args.layer}" + ("" if args.graded == "off" else f" {args.graded}")
    data = CurveData(rows, index, features, resolve_judge(args.annotator),
                     resolve_score(args.annotator) if args.graded != "off" else None,
                     FeatureExtractor.from_model(args.model),
                     {} if args.finetune_layers is None else {"finetune_layers": args.finetune_layers})
    started = time.perf_counter()
    lrs = [float(x) for x in args.lrs.split(",")]
    jobs = [(data, seed, args.votes, strategy, args.flip, lrs, args.epochs)
            for seed in range(args.seeds)]
    with multiprocessing.get_context("fork").Pool(min(args.jobs, args.seeds), torch.set_num_threads, (1,)) as pool:
        runs = pool.starmap(run_seed, jobs)
    head = [r["head"] for r in runs]
    print(f"\n{args.annotator}, {args.votes} votes ({args.flip:.0%} flips, {args.graded}), {args.seeds} seeds; "
          f"held-out accuracy (noiseless), mean ± std")
    print(f"{'head (LP)':<24}{statistics.fmean(head):>8.1%} ±{statistics.pstdev(head):.1%}")
    table = {}
    for lr in lrs:
        per_epoch = [[r["lpft"][str(lr)][e] for r in runs] for e in range(args.epochs)]
        table[str(lr)] = [round(statistics.fmean(v), 4) for v in per_epoch]
        print(f"{'LP-FT lr ' + str(lr):<24}" + "".join(
            f"{statistics.fmean(v):>8.1%} ±{statistics.pstdev(v):.1%} (e{e + 1})" for e, v in enumerate(per_epoch)))
    print(json.dumps({"bench": "reward_lpft", "annotator": args.annotator, "votes": args.votes, "flip": args.flip,
                      "graded": args.graded, "layer": args.layer, "seeds": args.seeds,
                      "head": round(statistics.fmean(head), 4), "head_std": round(statistics.pstdev(head), 4),
                      "lpft_by_epoch": table,
                      "seconds_per_fit": round(statistics.fmean(r["seconds_per_fit"] for r in runs), 1),
                      "seconds": round(time.perf_counter() - started, 1), "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
