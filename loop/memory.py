"""The memory plan of a round's PPO from the configuration (rlhf.memory_plan does the arithmetic): what `--plan`
prints, and what a round checks before it loads anything."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from loop.checks import RoundRefused
from loop.config import LoopConfig

GB = 1024 ** 3


@dataclass(frozen=True)
class DeviceMemory:
    """The memory one process may use: a GPU's, or without one this machine's."""

    bytes: int
    label: str
    gpu: bool


@dataclass(frozen=True)
class RoundMemoryPlan:
    """Every engine's plan for one model and configuration, with the engine to run."""

    shape: object
    """rlhf.model_shape.ModelShape."""
    settings: object
    """rlhf.memory_plan.PlanSettings."""
    plans: dict
    """engine -> rlhf.memory_plan.EnginePlan."""
    largest_batch: dict
    """engine -> the largest ppo.batch_size that fits (0: none)."""
    memory: DeviceMemory
    recommended: str | None
    why: str

    def to_json(self) -> dict:
        engines = {name: {"gb_per_gpu": round(plan.peak / GB, 2), "fits": plan.fits(self.memory.bytes),
                          "largest_batch_size": self.largest_batch[name],
                          "parts_gb": {**{m.role: round(m.total / GB, 3) for m in plan.models},
                                       "generation": round(plan.generation / GB, 3),
                                       "training": round(plan.training / GB, 3)}}
                   for name, plan in self.plans.items()}
        s = self.settings
        return {"model": self.shape.name, "parameters": self.shape.parameters, "gpus": s.gpus,
                "gpu_memory_gb": round(self.memory.bytes / GB, 1), "memory": self.memory.label,
                "batch_size": s.batch_size, "mini_batch_size": s.mini_batch_size, "prompt_tokens": s.prompt_tokens,
                "answer_tokens": s.answer_tokens, "reward_layers": s.reward_layers, "bf16": s.bf16,
                "engines": engines, "recommended": self.recommended, "why": self.why}


def device_memory(gpu_memory_gb: float | None = None) -> DeviceMemory:
    """`--gpu-memory` when given, else the first GPU's total memory, else this machine's physical memory."""
    if gpu_memory_gb is not None:
        return DeviceMemory(int(gpu_memory_gb * GB), f"{gpu_memory_gb:g} GB a GPU (--gpu-memory)", gpu=True)
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return DeviceMemory(props.total_memory, f"{props.name}, {props.total_memory / GB:.1f} GB", gpu=True)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceMemory(total, f"this machine's memory, {total / GB:.1f} GB (no GPU)", gpu=False)


def process_count() -> int:
    """Processes this run shares the work with: the launcher's WORLD_SIZE, else the visible GPUs (at least 1)."""
    if "WORLD_SIZE" in os.environ:
        return max(1, int(os.environ["WORLD_SIZE"]))
    import torch

    return max(1, torch.cuda.device_count())


def plan_settings(config: LoopConfig, shape, model_config, gpus: int, bf16: bool):
    """PlanSettings of config's PPO on `shape`: prompts fitted to the context as PPO fits them, the reward model's
    layers from votes.feature (every layer for the "full" strategy)."""
    from rlhf.memory_plan import PlanSettings
    from rlhf.models import prompt_budget
    from rlhf.reward.features import canonical_feature, parse_feature

    ppo = config.ppo
    answer = ppo.sampling.max_new_tokens
    budget = prompt_budget(model_config, answer, "[ppo.sampling] max_new_tokens")
    prompt = ppo.max_prompt_length if budget is None else min(budget, ppo.max_prompt_length)
    layer = parse_feature(canonical_feature(config.votes.feature, shape.layers))[1]
    reward_layers = shape.layers if config.votes.strategy == "full" or layer == -1 else layer
    return PlanSettings(batch_size=ppo.batch_size, mini_batch_size=min(ppo.mini_batch_size, ppo.batch_size),
                        prompt_tokens=prompt, answer_tokens=answer, reward_layers=reward_layers,
                        lora_rank=ppo.lora_r, bf16=bf16, gpus=gpus)


def uses_bf16(config: LoopConfig, memory: DeviceMemory) -> bool:
    """Whether PPO autocasts to bf16: ppo.mixed_precision "bf16", or "auto" on a GPU (given or present) or a CPU with
    bf16 arithmetic (rlhf.distributed.native_bf16)."""
    from rlhf.distributed import native_bf16

    precision = config.ppo.mixed_precision
    return precision == "bf16" or (precision == "auto" and (memory.gpu or native_bf16()))


def plan_round_memory(config: LoopConfig, model: str | None = None, gpus: int | None = None,
                      gpu_memory_gb: float | None = None, local_only: bool = False) -> RoundMemoryPlan:
    """The plan of every engine for `model` (default app.model) on `gpus` processes (default process_count) of
    `gpu_memory_gb` each (default device_memory's), built from the model's config alone (`local_only`: a hub name's
    from the local cache only)."""
    from rlhf.memory_plan import ENGINES, largest_batch, plan_engine, recommend
    from rlhf.model_shape import model_config, shape_from_config

    name = model or config.app.model
    text_config = model_config(name, local_only=local_only)
    shape = shape_from_config(text_config, str(name))
    memory = device_memory(gpu_memory_gb)
    settings = plan_settings(config, shape, text_config, gpus or process_count(), uses_bf16(config, memory))
    plans = {engine: plan_engine(shape, settings, engine) for engine in ENGINES}
    largest = {engine: largest_batch(shape, settings, engine, memory.bytes) for engine in ENGINES}
    recommended, why = recommend(plans, largest, memory.bytes, config.ppo.use_lora)
    return RoundMemoryPlan(shape, settings, plans, largest, memory, recommended, why)


def refuse_unfit_round(config: LoopConfig, actor_path: str) -> None:
    """RoundRefused, before any model loads, when the round's PPO (full or LoRA, as configured) needs more memory
    per process than the device has; the message gives both figures and what to change. A model whose config is not
    on this machine (a hub name not downloaded yet) is not checked: loading it says what is wrong."""
    from rlhf.models import ModelNotFoundError

    try:
        plan = plan_round_memory(config, model=actor_path, local_only=True)
    except (OSError, ValueError, ModelNotFoundError):
        return
    from rlhf.memory_plan import HEADROOM

    engine = run_engine(plan, config.ppo)
    chosen = plan.plans[engine]
    if chosen.fits(plan.memory.bytes):
        return
    largest = plan.largest_batch[engine]
    advice = [f"lower ppo.batch_size to {largest} (the largest that fits)" if largest else
              "shorten ppo.max_prompt_length or [ppo.sampling] max_new_tokens"]
    if engine == "ddp" and plan.plans["lora"].fits(plan.memory.bytes):
        advice.append("set ppo.use_lora = true (LoRA fits)")
    sharded = "fsdp2-lora" if config.ppo.use_lora else "fsdp2"
    if engine in ("ddp", "lora") and plan.settings.gpus > 1 and plan.plans[sharded].fits(plan.memory.bytes):
        advice.append("set ppo.engine = fsdp2 (FSDP2 fits)")
    raise RoundRefused(
        f"PPO would need about {chosen.peak / GB:.1f} GB per process ({engine}, batch {plan.settings.batch_size}) "
        f"and {plan.memory.label} leaves {HEADROOM * plan.memory.bytes / GB:.1f} GB after headroom: "
        f"{' or '.join(advice)}. `python app.py --plan` shows every engine's figures.")


def auto_engine(config: LoopConfig, model: str | None = None) -> str:
    """ppo.engine "auto" made concrete: "fsdp2" when several processes run and PPO (full or LoRA, as configured) does
    not fit under DDP while it does under FSDP2 (the plan of `model`, default app.model, from its local config);
    "ddp" otherwise, at once on one process or when the config is not on this machine."""
    from rlhf.models import ModelNotFoundError

    if process_count() == 1:
        return "ddp"
    try:
        plan = plan_round_memory(config, model=model, local_only=True)
    except (OSError, ValueError, ModelNotFoundError):
        return "ddp"
    return "fsdp2" if run_engine(plan, replace(config.ppo, engine="auto")).startswith("fsdp2") else "ddp"


def run_engine(plan: RoundMemoryPlan, ppo) -> str:
    """The plan's engine that PPO settings `ppo` run under: its DDP engine ("ddp", or "lora" with ppo.use_lora) or its
    FSDP2 one ("fsdp2", "fsdp2-lora"): FSDP2 when set, or when "auto" on several processes finds DDP too large and
    FSDP2 not."""
    whole, sharded = ("lora", "fsdp2-lora") if ppo.use_lora else ("ddp", "fsdp2")
    if ppo.engine != "auto":
        return sharded if ppo.engine == "fsdp2" else whole
    memory = plan.memory.bytes
    unfit = not plan.plans[whole].fits(memory) and plan.plans[sharded].fits(memory)
    return sharded if plan.settings.gpus > 1 and unfit else whole


def with_engine(settings, config: LoopConfig, model: str | None = None):
    """PPO `settings` (a PPOConfig) with engine "auto" made concrete by `auto_engine`; any other engine as it is."""
    return replace(settings, engine=auto_engine(config, model)) if settings.engine == "auto" else settings
