"""Reward-model training speed, memory and held-out accuracy on a fixed synthetic preference set.

    python bench/reward_train.py                 # default model, 200 pairs (40 held out), batch 8, max length 128
    python bench/reward_train.py --pairs 64 --steps 4 --model path/to/model   # a quick look

Prints a table, then ONE JSON line (the last line) with at least pairs_per_s, peak_rss_mb and
heldout_accuracy. pairs_per_s counts training pairs over the time spent in training steps (forward,
backward, optimizer), not loading the model or measuring the held-out pairs, like TRL's train_samples_per_second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repository root first

import torch

from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line, peak_rss_mb
from bench.synthetic_prefs import synthetic_preferences
from rlhf.reward.train import RewardTrainConfig, train_reward_model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="causal LM to start from (default: the embedded one)")
    parser.add_argument("--pairs", type=int, default=200, help="synthetic pairs, held-out ones included (default 200)")
    parser.add_argument("--heldout-fraction", type=float, default=0.2, help="share held out (default 0.2)")
    parser.add_argument("--steps", type=int, default=None, help="stop after N optimizer steps (default: 1 epoch)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training pairs (default 1)")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per step (default 8)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--lr", type=float, default=2e-5, help="peak learning rate (default 2e-5)")
    parser.add_argument("--loss", choices=["divergence", "last_token"], default="divergence", help="loss form")
    parser.add_argument("--no-share-prompt", dest="share_prompt", action="store_false",
                        help="run each pair's prompt twice, once per answer (RewardTrainConfig.share_prompt off)")
    parser.add_argument("--mixed-precision", choices=["auto", "no", "bf16"], default="auto",
                        help="auto: bf16 where the hardware has it (CUDA, AVX512-BF16/AMX CPUs), else fp32; bf16 forces autocast")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data and training (default 0); the split follows the prompts")
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    check_bf16(args.mixed_precision == "bf16", args.allow_emulated_bf16, machine, fp32_hint="--mixed-precision no")

    pairs = synthetic_preferences(args.pairs, seed=args.seed)
    config = RewardTrainConfig(
        model=args.model, learning_rate=args.lr, epochs=args.epochs, max_steps=args.steps,
        batch_size=args.batch_size, max_length=args.max_length, loss_form=args.loss,
        heldout_fraction=args.heldout_fraction, seed=args.seed, eval_batch_size=args.batch_size,
        share_prompt=args.share_prompt, mixed_precision=args.mixed_precision,
    )
    started = time.perf_counter()
    result = train_reward_model(pairs, config)
    wall_s = time.perf_counter() - started
    metrics = result.metrics
    figures = {
        "bench": "reward_train",
        "model": args.model,
        "device": str(result.model.v_head.weight.device),
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "loss_form": args.loss,
        "share_prompt": args.share_prompt,
        "mixed_precision": args.mixed_precision,
        "n_train": metrics["rm/n_train"],
        "n_heldout": metrics["rm/n_heldout"],
        "steps": metrics["rm/steps"],
        "pairs_per_s": round(metrics["rm/pairs_per_s"], 3),
        "train_s": round(metrics["time/rm_train_s"], 1),
        "wall_s": round(wall_s, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "train_accuracy": round(metrics["rm/accuracy"], 4),
        "heldout_accuracy": None if result.heldout_accuracy is None else round(result.heldout_accuracy, 4),
        "heldout_chosen_mean": round(metrics.get("rm/heldout_chosen_mean", float("nan")), 4),
        "heldout_rejected_mean": round(metrics.get("rm/heldout_rejected_mean", float("nan")), 4),
    }
    width = max(len(key) for key in figures)
    print("\nreward-model training")
    for key, value in figures.items():
        print(f"  {key:<{width}}  {value}")
    figures["machine"] = machine
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
