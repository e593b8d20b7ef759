"""PPO's settings (`[ppo]` in rlhf-loop.toml): DeepSpeed-Chat's step-3 defaults, each field documented."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from rlhf.sampling import Sampling

RewardFunction = Callable[[list[str]], list[float]]
"""Texts of a batch's answers -> one score each, higher preferred: a reward given as a function of the answer's text
(the demo's oracle: a simulated annotator's own score), in place of a reward model. Here, beside the settings, so that
the round names it without importing torch."""


ROLLOUT_SAMPLING = {"max_new_tokens": 48, "top_p": 1.0, "repetition_penalty": 1.0}
"""Where PPO's rollouts differ from Sampling's defaults (the pairs people rank): short answers (48 tokens: a round's
budget), no nucleus, no repetition penalty; temperature 0.7, no top-k and no min_new_tokens as there."""


def rollout_sampling(**settings) -> Sampling:
    """PPO's default rollout sampling with `settings` changed."""
    return Sampling(**{**ROLLOUT_SAMPLING, **settings})


@dataclass
class PPOConfig:
    """Every PPO knob; defaults are DeepSpeed-Chat's unless noted."""

    kl_ctl: float = 0.1
    """KL coefficient (initial value when adaptive): per-token reward -kl_ctl * (log pi - log pi_ref)."""
    clip_reward_value: float = 5.0
    """Reward-model scores are clipped to +-this before being added at the last response token."""
    cliprange: float = 0.2
    """PPO ratio clip epsilon of the actor loss."""
    cliprange_value: float = 0.2
    """How far new values may move from the old ones in the clipped critic loss."""
    gamma: float = 1.0
    """Discount of future rewards in GAE."""
    lam: float = 0.95
    """GAE lambda: bias/variance trade-off of the advantage estimate."""
    ppo_epochs: int = 1
    """Passes of actor and critic updates over each batch of experience."""
    batch_size: int = 8
    """Prompts per experience batch (per process)."""
    mini_batch_size: int = 8
    """Sequences per optimiser step within a batch of experience."""
    sampling: Sampling = field(default_factory=lambda: rollout_sampling())
    """How rollouts are sampled ([ppo.sampling]): 48 tokens at most, temperature 0.7, no top-k, top-p or repetition
    penalty by default. Log-probs, ratios and the KL are taken under the same settings, the distribution sampled from
    (as TRL divides by the temperature; DeepSpeed-Chat takes the raw logits), and a saved policy's
    generation_config.json states them; temperature must be above 0 (PPO samples)."""
    max_prompt_length: int = 256
    """Prompts are cut to their last this many tokens (the end holds the chat template's generation prompt)."""
    actor_lr: float = 3e-5
    """Actor learning rate (full fine-tuning). DeepSpeed-Chat's 9.65e-6 is for thousands of steps; a round runs tens
    (docs/few-votes.md, "PPO's budget: the learning rate")."""
    critic_lr: float = 5e-6
    """Critic learning rate (full fine-tuning)."""
    lora_lr: float = 5e-4
    """Learning rate of the adapters (and the critic's value head) in LoRA mode."""
    weight_decay: float = 0.0
    """AdamW weight decay of actor and critic."""
    max_grad_norm: float = 1.0
    """Gradient norm clip per model and optimiser step; 0 = off."""
    adaptive_kl: bool = False
    """Adapt kl_ctl toward kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target KL per sequence (summed over its tokens) of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon (in sequences) of the adaptive controller: larger moves kl_ctl more slowly."""
    stop_at_kl: float = 0.0
    """End the run early, after the step whose mean KL per answer to the reference (ppo/kl, summed over the answer's
    tokens) is above this; 0 = off. A budget of drift: a reward model fitted on few votes is over-optimised long before
    the steps run out, and its held-out votes are too few to tell when."""
    whiten_advantages: bool = False
    """Whiten advantages over the batch's response tokens (TRL does; DeepSpeed-Chat does not)."""
    normalize_rewards: bool = False
    """Normalise scores by the running mean and std of all scores seen, before clipping."""
    truncation_penalty: float = 0.0
    """Subtracted from the score of answers that hit max_new_tokens without EOS; 0 = off."""
    use_lora: bool = False
    """Train LoRA adapters on actor and critic; the reference is the actor with adapters disabled."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    steps: int = 0
    """PPO steps to run; 0 = `epochs` passes over the prompts."""
    epochs: int = 1
    """Passes over the prompts when steps is 0."""
    seed: int = 42
    """Seed of sampling, prompt order and LoRA initialisation, for --train-ppo; a round seeds its PPO with round.seed
    plus the round's id (loop.config.ppo_settings)."""
    reuse_forward: bool = True
    """With one epoch over one mini-batch, take old log-probs/values from the update's own forward pass."""
    mixed_precision: str = "auto"
    """auto: bf16 autocast where the hardware has bf16 arithmetic (CUDA, CPUs with AVX512-BF16 or AMX), else fp32
    (`accelerate launch`'s setting wins); "bf16" forces autocast; "no" is fp32 throughout. Weights stay fp32."""

    def __post_init__(self):
        if self.batch_size < 1 or self.mini_batch_size < 1 or self.ppo_epochs < 1:
            raise ValueError("batch_size, mini_batch_size and ppo_epochs must be at least 1")
        if self.steps < 0 or self.epochs < 1:  # else PPO runs no step at all
            raise ValueError(f"steps must be 0 (epochs passes over the prompts) or more and epochs at least 1 (got "
                             f"{self.steps} and {self.epochs})")
        self.sampling.__post_init__()
        if not self.sampling.temperature > 0:
            raise ValueError(f"sampling.temperature must be above 0 (PPO samples), not {self.sampling.temperature}")
        if self.stop_at_kl < 0:
            raise ValueError(f"stop_at_kl must be 0 (off) or a KL per answer above 0, not {self.stop_at_kl}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be auto, no, bf16 or fp16, not {self.mixed_precision!r}")

    @property
    def fused_first_update(self) -> bool:
        """Whether the experience pass of actor and critic is also the (only) update's forward pass."""
        return self.reuse_forward and self.ppo_epochs == 1 and self.mini_batch_size >= self.batch_size
