"""TRL's side of bench/compare_trl.py: one PPO run or one reward-model run, ending with ONE JSON line.

Runs in the TRL virtual environment (bench/trl_env.sh makes .venv-trl with trl==0.29.1), so it imports
only torch, transformers, datasets and trl, never the project. compare_trl.py launches it; by hand:

    .venv-trl/bin/python bench/trl_side.py ppo --model data/models/SmolLM2-135M-Instruct --steps 3
    .venv-trl/bin/python bench/trl_side.py reward --model data/models/SmolLM2-135M-Instruct \
        --train train.jsonl --heldout heldout.jsonl

PPO: `trl.experimental.ppo.PPOTrainer` with the policy and the reference as separate copies, reward and
value models `AutoModelForSequenceClassification(num_labels=1)` from the same checkpoint, one PPO epoch,
one mini-batch, no stop token (every answer is --max-new-tokens long), fp32 on the CPU, or with --bf16 TRL's
`bf16=True` (accelerate's bf16 autocast; the weights stay fp32, as ours). step_s is the
median time between the ends of successive steps, the first step not counted (as bench/ppo_step.py).
Reward: `trl.RewardTrainer` on conversational pairs (the chat template applies, as in rlhf-loop),
pairs_per_s is TRL's own train_samples_per_second, heldout_accuracy its eval accuracy on --heldout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    TrainerCallback,
)

# the same prompts, in the same order, as bench/ppo_step.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prompts import PROMPTS
from machine import peak_rss_mb


def load_tokenizer(path: str):
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def score_model(path: str, pad_token_id: int):
    """A one-logit sequence classifier on the checkpoint (the reward and value models of TRL's examples)."""
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = pad_token_id
    return model


class StepClock(TrainerCallback):
    """Wall-clock time of each PPO step: from the end of the previous one (or the start of training)."""

    def __init__(self):
        self.last = None
        self.steps: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.steps.append(now - self.last)
        print(f"trl ppo step {len(self.steps)}: {self.steps[-1]:.2f} s", file=sys.stderr, flush=True)
        self.last = now


def run_ppo(args) -> dict:
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenizer = load_tokenizer(args.model)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch_size * args.steps)]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    dataset = Dataset.from_dict({"input_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]})
    started = time.perf_counter()
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reward = score_model(args.model, tokenizer.pad_token_id)
    value = score_model(args.model, tokenizer.pad_token_id)
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="trl-ppo-") as out_dir:
        config = PPOConfig(
            output_dir=out_dir, per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=1,
            num_mini_batches=1, num_ppo_epochs=1, local_rollout_forward_batch_size=args.batch_size,
            response_length=args.max_new_tokens, stop_token=None, missing_eos_penalty=None,
            total_episodes=args.batch_size * args.steps, temperature=0.7, learning_rate=1e-6,
            num_sample_generations=0, report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(),
            bf16=args.bf16, fp16=False, seed=args.seed, logging_steps=1, dataloader_drop_last=True,
        )
        trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=reference,
                             reward_model=reward, train_dataset=dataset, value_model=value, callbacks=[clock])
        load_s = time.perf_counter() - started
        trainer.train()
    measured = clock.steps[1:] or clock.steps
    return {
        "bench": "trl_ppo_step", "trl": _trl_version(), "model": args.model, "threads": torch.get_num_threads(),
        "bf16": args.bf16,
        "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "measured_steps": len(measured),
        "step_s": round(statistics.median(measured), 3), "step_s_min": round(min(measured), 3), "load_s": round(load_s, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def _conversational(path: str) -> Dataset:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return Dataset.from_list([{
        "prompt": [{"role": "user", "content": row["prompt"]}],
        "chosen": [{"role": "assistant", "content": row["chosen"]}],
        "rejected": [{"role": "assistant", "content": row["rejected"]}],
    } for row in rows])


def run_reward(args) -> dict:
    from trl import RewardConfig, RewardTrainer

    tokenizer = load_tokenizer(args.model)
    tokenizer.padding_side = "right"
    train, heldout = _conversational(args.train), _conversational(args.heldout)
    model = score_model(args.model, tokenizer.pad_token_id)
    with tempfile.TemporaryDirectory(prefix="trl-rm-") as out_dir:
        config = RewardConfig(
            output_dir=out_dir, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
            max_length=args.max_length, learning_rate=args.lr, num_train_epochs=1, max_steps=args.steps or -1,
            report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(), bf16=args.bf16, fp16=False,
            seed=args.seed, logging_steps=1, eval_strategy="no",
        )
        trainer = RewardTrainer(model=model, args=config, processing_class=tokenizer, train_dataset=train,
                                eval_dataset=heldout)
        trained = trainer.train()
        trainer.evaluate()  # its accuracy reaches the log (RewardTrainer.log), not the returned dict
        evaluated = next(entry for entry in reversed(trainer.state.log_history) if "eval_accuracy" in entry)
    return {
        "bench": "trl_reward_train", "trl": _trl_version(), "model": args.model, "threads": torch.get_num_threads(),
        "bf16": args.bf16,
        "batch_size": args.batch_size, "max_length": args.max_length, "n_train": len(train), "n_heldout": len(heldout),
        "steps": trained.global_step, "pairs_per_s": round(trained.metrics["train_samples_per_second"], 3),
        "train_s": round(trained.metrics["train_runtime"], 1), "peak_rss_mb": round(peak_rss_mb(), 1),
        "heldout_accuracy": round(evaluated["eval_accuracy"], 4),
    }


def _trl_version() -> str:
    import trl

    return trl.__version__


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("side", choices=["ppo", "reward"])
    parser.add_argument("--model", required=True, help="folder of the checkpoint (the converted default model)")
    parser.add_argument("--steps", type=int, default=None, help="PPO steps (first not counted) / reward steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--train", help="reward: JSONL of prompt/chosen/rejected to train on")
    parser.add_argument("--heldout", help="reward: JSONL of held-out pairs")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="TRL's bf16=True: bf16 autocast, fp32 weights")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side == "ppo":
        args.steps = args.steps or 4
        figures = run_ppo(args)
    else:
        if not (args.train and args.heldout):
            parser.error("reward needs --train and --heldout")
        figures = run_reward(args)
    print(json.dumps(figures), flush=True)
    return figures


if __name__ == "__main__":
    main()
