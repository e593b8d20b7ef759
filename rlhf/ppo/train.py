"""A whole PPO run from model folders (`train_ppo`), LoRA set-up, and `python app.py --train-ppo`.

LoRA rounds chain adapters on the base model: a policy saved by a LoRA run is a folder of adapters on the model they
were first added to, and the next LoRA run goes on training those adapters on that same model (never fresh adapters on
merged weights), so every policy is a few MB on one shared base.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from torch import nn

from rlhf.models import (adapter_base_path, base_reference, context_length, is_adapter_folder, load_adapter_model,
                         load_causal_lm, load_tokenizer, prepare_model_and_tokenizer, prompt_budget, resolve_model_path,
                         tell_once)
from rlhf.distributed import make_accelerator
from rlhf.ppo.trainer import AnswerScoring, PPOConfig, PPOTrainer, RewardFunction
from rlhf.reward.model import RewardModel
from rlhf.reward.strategies import score_heads

HEAD_NAMES = {"lm_head", "v_head", "score"}
"""Output layers: trained in full or kept frozen, never given adapters."""


@dataclass
class PPOResult:
    """What a PPO run hands back to the round."""

    history: list[dict]
    """Metrics of every step, in order (`ppo/*`, `time/*`, `gen/*`)."""
    saved_path: Path
    """Folder of the new actor with its tokenizer: its adapters alone in LoRA mode (peft's format, on the base model
    adapter_config.json names), else the whole model."""
    config: dict = field(default_factory=dict)
    """The PPOConfig used, sampling settings included, to record with the round."""


def lora_target_modules(model: nn.Module) -> list[str]:
    """Names of the decoder's linear layers (q/k/v/o and MLP projections for Llama), heads excluded."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    return sorted(names - HEAD_NAMES)


def add_lora(model: nn.Module, config: PPOConfig, causal_lm: bool):
    """Wrap `model` with fresh LoRA adapters (peft); a critic's value head stays fully trainable.

    The value head goes to `modules_to_save`: peft trains a copy and keeps the original, so the critic
    with its adapters disabled is exactly the reward model it was initialised from.
    """
    lora_config = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=lora_target_modules(model),
        modules_to_save=None if causal_lm else ["v_head"],
        task_type="CAUSAL_LM" if causal_lm else None,
    )
    torch.manual_seed(config.seed)  # the adapters' random A matrices
    return get_peft_model(model, lora_config)


def load_lora_actor(actor_path: str | Path, config: PPOConfig, tokenizer):
    """(actor with adapters to train, the model they sit on) in LoRA mode: a folder of adapters goes on training those
    adapters on their base (adapter_config.json's); any other folder gets fresh adapters, on itself."""
    if is_adapter_folder(actor_path):
        base = adapter_base_path(actor_path)
        actor = load_adapter_model(actor_path, trainable=True)
        prepare_model_and_tokenizer(actor, tokenizer, str(actor_path))
        saved = actor.peft_config["default"]
        if (saved.r, saved.lora_alpha) != (config.lora_r, config.lora_alpha):
            tell_once(f"PPO: the adapters of {actor_path} keep their rank {saved.r} and alpha {saved.lora_alpha}; "
                      "ppo.lora_r and ppo.lora_alpha apply to fresh adapters only.")
        return actor, base
    actor = add_lora(load_causal_lm(actor_path, tokenizer=tokenizer), config, causal_lm=True)
    actor.peft_config["default"].base_model_name_or_path = base_reference(actor_path)  # what the saved folder names
    return actor, actor_path


def _same_model(a: str | Path, b: str | Path) -> bool:
    """Whether two model names point at the same weights (folders compared after resolving the path)."""
    if Path(a).exists() and Path(b).exists():
        return Path(a).resolve() == Path(b).resolve()
    return str(a) == str(b)


def fit_prompt_length(config: PPOConfig, model_config) -> PPOConfig:
    """`config` with max_prompt_length lowered so that prompt + max_new_tokens fit the model's context (refused with
    a ModelSetupError when max_new_tokens leaves no room for a prompt)."""
    budget = prompt_budget(model_config, config.sampling.max_new_tokens, "[ppo.sampling] max_new_tokens")
    if budget is None or budget >= config.max_prompt_length:
        return config
    tell_once(f"PPO: prompts are cut to their last {budget} tokens, not max_prompt_length = "
              f"{config.max_prompt_length}, so that they fit the model's {context_length(model_config)}-token "
              f"context with max_new_tokens = {config.sampling.max_new_tokens}.")
    return replace(config, max_prompt_length=budget)


def ppo_reward_heads(config: PPOConfig, reward_model_path: str | Path,
                     reward_function: RewardFunction | None = None) -> torch.Tensor | None:
    """The bootstrap heads (H, D) that score on the reward model's own features (rlhf.reward.strategies.score_heads),
    for the conservative reward, the drift budget and ppo/head_spread; None when there are none or a reward function
    scores the answers, refused (a ValueError saying what to set) when a setting needs them."""
    if reward_function is not None:
        heads, why = None, "a reward function scores the answers in place of the reward model"
    else:
        heads, why = score_heads(reward_model_path)
        why = f"the reward model {reward_model_path}: {why}"
    if heads is None:
        config.refuse_without_heads(why)
    return heads


def build_ppo_trainer(
    actor_path: str | Path,
    reward_model_path: str | Path,
    config: PPOConfig,
    reference_path: str | Path | None = None,
    critic_path: str | Path | None = None,
    accelerator: Accelerator | None = None,
    reward_function: RewardFunction | None = None,
) -> PPOTrainer:
    """The four models from folders: actor (and by default reference) from `actor_path`, frozen reward
    model and critic (by default) from `reward_model_path`, as DeepSpeed-Chat initialises the critic.

    LoRA mode holds shared weights once: the reference is the actor with adapters disabled when it is the model the
    adapters sit on, and the reward model is the critic with adapters disabled when the critic starts from it. An
    actor folder of adapters (a LoRA policy) goes on training them on their base (`load_lora_actor`); without LoRA it
    loads merged and trains in full.
    With a `reward_function` the answers are scored by it: the reward model is not loaded, the critic still starts
    from `reward_model_path`. The reward model's bootstrap heads come along when it has them (`ppo_reward_heads`).
    """
    heads = ppo_reward_heads(config, reward_model_path, reward_function)  # refused before any model loads
    accelerator = accelerator or make_accelerator(config.mixed_precision)
    # Frozen models stay in fp32 under bf16 autocast, as the trained ones. Stored in bf16, a model's residual
    # stream is bf16 as well: the reference's log-probs then drift from the actor's at equal weights (KL -0.034
    # per answer against -0.0003, bench/bf16_accuracy.py) and CPU scoring was slower (3.7 s against 2.9 s a step).
    same_critic = critic_path is None or _same_model(critic_path, reward_model_path)
    tokenizer = load_tokenizer(actor_path)
    # trained: fp32 weights, bf16 autocast where the hardware has it
    if config.use_lora:
        actor, base = load_lora_actor(actor_path, config, tokenizer)
        # the reference by default is the actor as it starts: the adapters' base only when they are fresh
        same_reference = _same_model(resolve_model_path(reference_path or actor_path), resolve_model_path(base))
    else:
        actor, same_reference = load_causal_lm(actor_path, tokenizer=tokenizer), False
    config = fit_prompt_length(config, actor.config)
    critic = RewardModel.from_pretrained(critic_path or reward_model_path)
    reference = reward_model = None
    if config.use_lora:
        critic = add_lora(critic, config, causal_lm=False)
    if not same_reference:
        reference = load_causal_lm(reference_path or actor_path, dtype=torch.float32, tokenizer=tokenizer)
    if reward_function is None and not (config.use_lora and same_critic):
        reward_model = RewardModel.from_pretrained(reward_model_path, dtype=torch.float32)
    return PPOTrainer(actor, critic, tokenizer, config, reward_model=reward_model, reference=reference,
                      accelerator=accelerator, scoring=AnswerScoring(reward_function, heads))


def reward_label(reward_model_path: str | Path, reward_function: RewardFunction | None = None) -> str:
    """What a policy's model card names as its reward: the reward model's folder, or the function that replaced it."""
    if reward_function is None:
        return str(reward_model_path)
    name = getattr(reward_function, "__name__", type(reward_function).__name__)
    return f"none: the reward function {name} scored the answers (the critic started from {reward_model_path})"


def summarise_ppo(history: list[dict]) -> dict:
    """Means over a run's steps, under the same names (ppo/*, time/*; not the step counter)."""
    if not history:
        return {}
    keys = [key for key in history[0] if key.startswith(("ppo/", "time/")) and key != "ppo/step"]
    return {key: sum(step[key] for step in history) / len(history) for key in keys}


def train_ppo(
    actor_path: str | Path,
    reward_model_path: str | Path,
    prompts: list[str],
    config: PPOConfig,
    out_dir: str | Path,
    reference_path: str | Path | None = None,
    on_step: Callable[[dict], None] | None = None,
    reward_function: RewardFunction | None = None,
) -> PPOResult:
    """A PPO run over `prompts` (see `build_ppo_trainer` for the models: the critic starts from the reward model;
    `reward_function` scores the answers in place of the reward model); saves the new actor to `out_dir` (its model card
    is the caller's: loop.model_card). `on_step(metrics)` after every step."""
    trainer = build_ppo_trainer(actor_path, reward_model_path, config, reference_path, reward_function=reward_function)
    history = trainer.train(prompts, on_step=on_step)
    saved = trainer.save_actor(out_dir)
    return PPOResult(history=history, saved_path=saved, config=asdict(trainer.config))  # max_prompt_length as fitted
