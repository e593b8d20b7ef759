"""PPO's settings (`[ppo]` in rlhf-loop.toml): DeepSpeed-Chat's step-3 defaults, each field documented."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from rlhf.sampling import Sampling
from rlhf.settings_range import (LEARNING_RATE, POSITIVE_COUNT, SEED, above, at_least, between, check_ranges,
                                  ranged)

RewardFunction = Callable[[list[str]], list[float]]
"""Texts of a batch's answers -> one score each, higher preferred: a reward given as a function of the answer's text
(the demo's oracle: a simulated annotator's own score), in place of a reward model. Here, beside the settings, so that
the round names it without importing torch."""


ROLLOUT_SAMPLING = {"max_new_tokens": 48, "top_p": 1.0, "repetition_penalty": 1.0}
"""Where PPO's rollouts differ from Sampling's defaults (the pairs people rank): short answers (48 tokens: a round's
budget), no nucleus, no repetition penalty; temperature 0.7, no top-k and no min_new_tokens as there."""


class NeedsHeads(ValueError):
    """A setting that reads the reward model's bootstrap heads is on and there are none; the message says what to
    set."""


ENGINES = ("auto", "ddp", "fsdp2")
"""PPOConfig.engine's values."""
HEADS_SETTINGS = ("reward_spread_penalty", "drift_budget")
"""PPOConfig's settings that read the reward model's bootstrap heads (rlhf.reward.conservative)."""


def rollout_sampling(**settings) -> Sampling:
    """PPO's default rollout sampling with `settings` changed."""
    return Sampling(**{**ROLLOUT_SAMPLING, **settings})


@dataclass
class PPOConfig:
    """Every PPO knob; defaults are DeepSpeed-Chat's unless noted."""

    kl_ctl: float = ranged(0.1, at_least(0))
    """KL coefficient (initial value when adaptive): per-token reward -kl_ctl * (log pi - log pi_ref)."""
    clip_reward_value: float = ranged(5.0, above(0))
    """Reward-model scores are clipped to +-this before being added at the last response token."""
    cliprange: float = ranged(0.2, above(0))
    """PPO ratio clip epsilon of the actor loss."""
    cliprange_value: float = ranged(0.2, above(0))
    """How far new values may move from the old ones in the clipped critic loss."""
    gamma: float = ranged(1.0, between(0, 1))
    """Discount of future rewards in GAE."""
    lam: float = ranged(0.95, between(0, 1))
    """GAE lambda: bias/variance trade-off of the advantage estimate."""
    ppo_epochs: int = ranged(1, POSITIVE_COUNT)
    """Passes of actor and critic updates over each batch of experience."""
    batch_size: int = ranged(8, POSITIVE_COUNT)
    """Prompts per experience batch (per process)."""
    mini_batch_size: int = ranged(8, POSITIVE_COUNT)
    """Sequences per optimiser step within a batch of experience."""
    sampling: Sampling = field(default_factory=lambda: rollout_sampling())
    """How rollouts are sampled ([ppo.sampling]): 48 tokens at most, temperature 0.7, no top-k, top-p or repetition
    penalty by default. Log-probs, ratios and the KL are taken under the same settings, the distribution sampled from
    (as TRL divides by the temperature; DeepSpeed-Chat takes the raw logits), and a saved policy's
    generation_config.json states them; temperature must be above 0 (PPO samples)."""
    max_prompt_length: int = ranged(256, POSITIVE_COUNT)
    """Prompts are cut to their last this many tokens (the end holds the chat template's generation prompt)."""
    actor_lr: float = ranged(3e-5, LEARNING_RATE)
    """Actor learning rate (full fine-tuning). DeepSpeed-Chat's 9.65e-6 is for thousands of steps; a round runs tens
    (docs/few-votes.md, "PPO's budget: the learning rate")."""
    critic_lr: float = ranged(5e-6, LEARNING_RATE)
    """Critic learning rate (full fine-tuning)."""
    lora_lr: float = ranged(5e-4, LEARNING_RATE)
    """Learning rate of the adapters (and the critic's value head) in LoRA mode."""
    weight_decay: float = ranged(0.0, at_least(0))
    """AdamW weight decay of actor and critic."""
    max_grad_norm: float = ranged(1.0, at_least(0, "0: off"))
    """Gradient norm clip per model and optimiser step; 0 = off."""
    adaptive_kl: bool = False
    """Adapt kl_ctl toward kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = ranged(6.0, above(0))
    """Target KL per sequence (summed over its tokens) of the adaptive controller."""
    kl_horizon: float = ranged(10000.0, above(0))
    """Horizon (in sequences) of the adaptive controller: larger moves kl_ctl more slowly."""
    stop_at_kl: float = ranged(0.0, at_least(0, "0: off"))
    """End the run early, after the step whose mean KL per answer to the reference (ppo/kl, summed over the answer's
    tokens) is above this; 0 = off. A budget of drift: a reward model fitted on few votes is over-optimised long before
    the steps run out, and its held-out votes are too few to tell when."""
    reward_spread_penalty: float = ranged(0.0, at_least(0, "0: off"))
    """k of a conservative reward: an answer's reward is the mean of the reward model's bootstrap heads' scores less k
    times their standard deviation (population, as their disagreement is; rlhf.reward.conservative), in place of the
    main head's score, so PPO gains nothing from answers only some heads like (Coste et al. 2023); 0 = off (the main
    head's score, unchanged). Needs a "head", "ensemble" or "lpft" reward model with votes.n_heads of 2 or more (an
    lpft round then fits them on its fine-tuned features: rlhf.reward.config.StrategyConfig.tuned_heads)."""
    drift_budget: float = ranged(0.0, at_least(0, "0: off"))
    """End the run early, after the step whose answers' mean head spread (ppo/head_spread: the standard deviation of
    the bootstrap heads' scores of an answer) is above (1 + this) times the first step's: the answers have moved where
    the votes say little; 0 = off. Needs the heads as reward_spread_penalty does."""
    whiten_advantages: bool = False
    """Whiten advantages over the batch's response tokens (TRL does; DeepSpeed-Chat does not)."""
    normalize_rewards: bool = False
    """Normalise scores by the running mean and std of all scores seen, before clipping."""
    truncation_penalty: float = ranged(0.0, at_least(0, "0: off"))
    """Subtracted from the score of answers that hit max_new_tokens without EOS; 0 = off."""
    use_lora: bool = False
    """Train LoRA adapters on actor and critic; the reference is the actor with adapters disabled. A policy is saved as
    its adapters alone (peft's format, a few MB) on the base model, and the next LoRA round goes on training them there;
    `python app.py --merge POLICY OUT` writes a whole model to publish."""
    lora_r: int = ranged(16, POSITIVE_COUNT)
    """LoRA rank."""
    lora_alpha: int = ranged(32, POSITIVE_COUNT)
    """LoRA scaling numerator (scale = alpha / r)."""
    steps: int = ranged(0, at_least(0, "0: `epochs` passes over the prompts"))
    """PPO steps to run; 0 = `epochs` passes over the prompts."""
    epochs: int = ranged(1, POSITIVE_COUNT)
    """Passes over the prompts when steps is 0."""
    seed: int = ranged(42, SEED)
    """Seed of sampling, prompt order and LoRA initialisation, for --train-ppo; a round seeds its PPO with round.seed
    plus the round's id (loop.config.ppo_settings)."""
    reuse_forward: bool = True
    """With one epoch over one mini-batch, take old log-probs/values from the update's own forward pass."""
    mixed_precision: str = "auto"
    """auto: bf16 autocast where the hardware has bf16 arithmetic (CUDA, CPUs with AVX512-BF16 or AMX), else fp32
    (`accelerate launch`'s setting wins); "bf16" forces autocast; "no" is fp32 throughout. Weights stay fp32."""
    engine: str = "auto"
    """How the four models are split over the processes of `torchrun` / `accelerate launch`: "ddp" (each holds them
    whole; gradients averaged), "fsdp2" (torch's fully_shard per decoder layer: weights, the trained models' gradients
    and optimiser state split, a whole copy of the actor refreshed once per rollout for generation and saving; full or
    LoRA; rlhf.ppo.fsdp2), or "auto": the memory plan's choice for a round or --train-ppo (loop.memory.auto_engine):
    fsdp2 on several processes when DDP (full or LoRA, as configured) does not fit and FSDP2 does, ddp otherwise (and
    always on one process).
    `python app.py --plan` gives every engine's memory."""

    def __post_init__(self):
        check_ranges(self)
        self.sampling.__post_init__()
        if not self.sampling.temperature > 0:
            raise ValueError(f"sampling.temperature must be above 0 (PPO samples), not {self.sampling.temperature}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be auto, no, bf16 or fp16, not {self.mixed_precision!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")

    def refuse_without_heads(self, why: str) -> None:
        """NeedsHeads (a ValueError) saying what to set when a setting on needs the reward model's bootstrap heads
        (HEADS_SETTINGS) and there are none, `why` saying why."""
        on = [name for name in HEADS_SETTINGS if getattr(self, name)]
        if self.reads_heads:
            verb = "needs" if len(on) == 1 else "need"
            raise NeedsHeads(f"{' and '.join(f'ppo.{name} = {getattr(self, name)}' for name in on)} {verb} the reward "
                             f"model's bootstrap heads, and there are none: {why}. Train the reward model with "
                             f"votes.strategy \"head\", \"ensemble\" or \"lpft\" and votes.n_heads of 2 or more, or "
                             f"set "
                             f"{' and '.join(f'ppo.{name} = 0' for name in on)}.")

    @property
    def reads_heads(self) -> bool:
        """A setting on that reads the reward model's bootstrap heads (HEADS_SETTINGS)."""
        return any(getattr(self, name) for name in HEADS_SETTINGS)

    @property
    def fused_first_update(self) -> bool:
        """Whether the experience pass of actor and critic is also the (only) update's forward pass."""
        return self.reuse_forward and self.ppo_epochs == 1 and self.mini_batch_size >= self.batch_size
