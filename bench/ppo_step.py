"""PPO step time and memory of the default model: batch 8, 48 new tokens, one PPO epoch, one mini-batch.

    python bench/ppo_step.py                      # full fine-tuning, 4 steps (the first is not counted)
    python bench/ppo_step.py --lora               # LoRA: reference = actor, reward = critic, adapters disabled
    python bench/ppo_step.py --full-length        # always 48 new tokens (no stop at EOS), as TRL is compared

The reward model is an untrained `RewardModel.from_causal_lm(--model)` (scored as --reward-feature says) saved to a temporary folder (its
scores do not matter for speed) and the critic starts from it, through the same loading path as
`train_ppo`. Prints one line per step, then ONE JSON line (the last line): step_s is the median step
over the measured steps (step_s_min the fastest), generate_s / score_s / update_s the medians of the phases, tokens_per_s the
generated tokens per second of whole step, peak_rss_mb the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the repository root first

import torch

from bench.machine import add_bf16_flag, check_bf16, describe_machine, machine_line, peak_rss_mb
from rlhf.models import load_tokenizer, resolve_model_path
from rlhf.ppo.train import build_ppo_trainer
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.reward.model import RewardModel
from rlhf.reward.features import parse_feature

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prompts import PROMPTS


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="actor, reference and reward backbone (default: embedded)")
    parser.add_argument("--steps", type=int, default=4, help="PPO steps, the first not counted (default 4)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="response length limit (default 48)")
    parser.add_argument("--full-length", action="store_true",
                        help="always generate --max-new-tokens tokens (EOS suppressed until then)")
    parser.add_argument("--lora", action="store_true", help="LoRA adapters on actor and critic")
    parser.add_argument("--no-reuse", action="store_true",
                        help="separate no-grad passes for old log-probs and values (to measure what reuse saves)")
    parser.add_argument("--mixed-precision", choices=["auto", "no", "bf16"], default="auto",
                        help="auto: bf16 where the hardware has it (CUDA, AVX512-BF16/AMX CPUs), else fp32; bf16 forces autocast")
    parser.add_argument("--reward-feature", default="last@-1",
                        help="score definition of the reward model and critic: last@-1 (a whole model, as TRL's "
                             "value model) or the round's default mean@2 (2 layers, mean over the answer)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    add_bf16_flag(parser)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is not counted")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    check_bf16(args.mixed_precision == "bf16", args.allow_emulated_bf16, machine, fp32_hint="--mixed-precision no")

    config = PPOConfig(batch_size=args.batch_size, mini_batch_size=args.batch_size, ppo_epochs=1, use_lora=args.lora,
                       reuse_forward=not args.no_reuse, seed=args.seed, mixed_precision=args.mixed_precision,
                       sampling=rollout_sampling(max_new_tokens=args.max_new_tokens,
                                                 min_new_tokens=args.max_new_tokens if args.full_length else 0))
    actor_path = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory(prefix="ppo-bench-rm-") as reward_dir:
        pooling, layer = parse_feature(args.reward_feature)
        backbone = RewardModel.from_causal_lm(actor_path).backbone
        RewardModel(backbone, pooling=pooling, layer=layer).save_pretrained(reward_dir,
                                                                            tokenizer=load_tokenizer(actor_path))
        started = time.perf_counter()
        trainer = build_ppo_trainer(actor_path, reward_dir, config)
        load_s = time.perf_counter() - started
    steps = []
    for index in range(args.steps):
        prompts = [PROMPTS[(index * args.batch_size + i) % len(PROMPTS)] for i in range(args.batch_size)]
        started = time.perf_counter()
        metrics = trainer.step(prompts)
        metrics["step_s"] = time.perf_counter() - started
        steps.append(metrics)
        print(f"step {index + 1}: {metrics['step_s']:.2f} s (generate {metrics['time/generate']:.2f}, "
              f"score {metrics['time/score']:.2f}, update {metrics['time/update']:.2f}), "
              f"{metrics['ppo/response_len']:.1f} tokens/answer", file=sys.stderr, flush=True)
    measured = steps[1:]

    def median(key: str) -> float:
        return round(statistics.median(m[key] for m in measured), 3)

    tokens = [m["ppo/response_len"] * args.batch_size / m["step_s"] for m in measured]
    figures = {
        "bench": "ppo_step",
        "model": args.model,
        "device": str(trainer.accelerator.device),
        "mixed_precision": trainer.accelerator.mixed_precision,
        "threads": torch.get_num_threads(),
        "lora": args.lora,
        "reward_feature": args.reward_feature,
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "full_length": args.full_length,
        "fused_first_update": config.fused_first_update,
        "measured_steps": len(measured),
        "step_s": median("step_s"),
        "step_s_min": round(min(m["step_s"] for m in measured), 3),
        "generate_s": median("time/generate"),
        "score_s": median("time/score"),
        "update_s": median("time/update"),
        "tokens_per_s": round(statistics.median(tokens), 2),
        "response_len": median("ppo/response_len"),
        "load_s": round(load_s, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    if torch.cuda.is_available():
        figures["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    figures["machine"] = machine
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
