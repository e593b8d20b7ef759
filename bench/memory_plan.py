"""The memory plan (rlhf.memory_plan, `python app.py --plan`) against the measured peak of one PPO step.

Builds the four models as a round does (the reward model and critic on --reward-feature's layers), runs --steps PPO
steps on prompts cut to exactly --prompt-tokens tokens with answers of exactly --answer-tokens tokens (EOS held
back), and reads the process's resident memory (VmRSS) every 2 ms from before the models load to the step's end.
The measured figure is that peak less the memory before loading (Python, torch, the tokenizer); the plan's is its
`peak`. glibc is told to return freed blocks at once (MALLOC_SETTINGS), so resident memory follows the tensors alive,
as torch.cuda.max_memory_allocated would on a GPU.

    python bench/memory_plan.py --model tiny
    python bench/memory_plan.py --model default --engine lora

Prints the plan's parts and the measurement, then one JSON line: planned_mb, measured_mb, ratio (planned over
measured), and the settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.machine import describe_machine, machine_line
from rlhf.memory_plan import PlanSettings, plan_engine
from rlhf.model_shape import model_config, shape_from_config

MB = 1024 * 1024


def resident_bytes() -> int:
    """Bytes of this process's resident memory (VmRSS): its own allocations and the model files' pages that
    safetensors maps in place of copying them."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS (Linux only)")


class PeakSampler:
    """The largest resident_bytes() seen by a thread polling every `interval` seconds while it runs."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak, self._stop = interval, resident_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


def model_folder(name: str, scratch: Path) -> str:
    """--model as a folder: "tiny" builds the tests' tiny random model into `scratch`."""
    if name != "tiny":
        from rlhf.models import resolve_model_path

        return resolve_model_path(name)
    from rlhf.models import build_tiny_model, load_tokenizer, resolve_model_path

    return str(build_tiny_model(scratch / "tiny", load_tokenizer(resolve_model_path("default"))))


def reward_folder(actor: str, feature: str, out: Path) -> str:
    """An untrained reward model on `feature`'s layers, saved as a round's (its scores do not matter here)."""
    from rlhf.models import load_tokenizer
    from rlhf.reward.features import canonical_feature, parse_feature
    from rlhf.reward.model import RewardModel

    backbone = RewardModel.from_causal_lm(actor).backbone
    pooling, layer = parse_feature(canonical_feature(feature, backbone.config.num_hidden_layers))
    RewardModel(backbone, pooling=pooling, layer=layer).save_pretrained(out, tokenizer=load_tokenizer(actor))
    return str(out)


def long_prompts(batch: int) -> list[str]:
    """Prompts longer than any --prompt-tokens, so each is cut to exactly that many tokens."""
    return [f"Question {i}: " + "Tell me more about the weather, the sea and the hills. " * 120 for i in range(batch)]


def measure(args, actor: str, reward: str, plan_settings: PlanSettings) -> int:
    """Peak resident memory above the start of one PPO step's whole life: loading the four models and the step."""
    from rlhf.ppo.config import PPOConfig, rollout_sampling
    from rlhf.ppo.train import build_ppo_trainer

    config = PPOConfig(batch_size=args.batch_size, mini_batch_size=args.batch_size, ppo_epochs=1,
                       use_lora=args.engine == "lora", max_prompt_length=args.prompt_tokens, mixed_precision="no",
                       sampling=rollout_sampling(max_new_tokens=args.answer_tokens, min_new_tokens=args.answer_tokens))
    before = resident_bytes()
    with PeakSampler() as sampler:
        trainer = build_ppo_trainer(actor, reward, config)
        loaded = resident_bytes() - before
        for _ in range(args.steps):  # AdamW's state exists from the first step's end: the later steps hold it all along
            metrics = trainer.step(long_prompts(args.batch_size))
    print(f"step: {metrics['ppo/response_len']:.0f} tokens an answer, KL {metrics['ppo/kl']:.4f}; measured: models "
          f"loaded {loaded / MB:.1f} MB, the step's peak {(sampler.peak - before) / MB:.1f} MB", flush=True)
    return sampler.peak - before


MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc hands every block of 64 KB or more back to the system when it is freed, so resident memory follows the
tensors alive (with its defaults, freed blocks stayed resident: a LoRA step measured 3.8 GB for 2.5 GB of tensors)."""


def main() -> int:
    if any(key not in os.environ for key in MALLOC_SETTINGS):  # glibc reads them at start: run again with them
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_SETTINGS})
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (the tests' random model), default, or a folder")
    parser.add_argument("--engine", choices=["ddp", "lora"], default="ddp", help="full fine-tuning or LoRA, one "
                        "process")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--reward-feature", default="mean@2", help="the reward model's and critic's layers, as "
                        "votes.feature (the round's default mean@2)")
    parser.add_argument("--steps", type=int, default=2, help="PPO steps measured (2: the first step allocates AdamW's "
                        "state after its backward pass, the second holds it through the forward)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(machine_line(machine), flush=True)
    with tempfile.TemporaryDirectory(prefix="memory-plan-") as scratch:
        actor = model_folder(args.model, Path(scratch))
        reward = reward_folder(actor, args.reward_feature, Path(scratch) / "reward")
        shape = shape_from_config(model_config(actor), args.model)
        from rlhf.reward.features import canonical_feature, parse_feature

        layer = parse_feature(canonical_feature(args.reward_feature, shape.layers))[1]
        settings = PlanSettings(batch_size=args.batch_size, mini_batch_size=args.batch_size,
                                prompt_tokens=args.prompt_tokens, answer_tokens=args.answer_tokens,
                                reward_layers=shape.layers if layer == -1 else layer,
                                lora_rank=16)
        plan = plan_engine(shape, settings, args.engine)
        measured = measure(args, actor, reward, settings)
    for model in plan.models:
        print(f"plan: {model.role} {model.total / MB:.1f} MB ({model.parameters:,} parameters)")
    print(f"plan: generation +{plan.generation / MB:.1f} MB, training +{plan.training / MB:.1f} MB; peak "
          f"{plan.peak / MB:.1f} MB; measured {measured / MB:.1f} MB ({plan.peak / measured:.2f}x)")
    print(json.dumps({"bench": "memory_plan", "model": args.model, "engine": args.engine,
                      "batch_size": args.batch_size, "prompt_tokens": args.prompt_tokens,
                      "answer_tokens": args.answer_tokens, "reward_feature": args.reward_feature,
                      "planned_mb": round(plan.peak / MB, 1), "measured_mb": round(measured / MB, 1),
                      "ratio": round(plan.peak / measured, 3), "machine": machine}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
