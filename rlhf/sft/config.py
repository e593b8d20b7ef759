"""The SFT settings ([sft] of rlhf-loop.toml), importable without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhf.fsdp2 import TRAINING_ENGINES
from rlhf.settings_range import LEARNING_RATE, POSITIVE_COUNT, SEED, SHARE, above, at_least, check_ranges, ranged


@dataclass
class SFTConfig:
    """Settings of one SFT run."""

    learning_rate: float = ranged(5e-5, LEARNING_RATE)
    """AdamW peak learning rate (about 5e-5 is the usual choice for 1 to 3 epochs)."""
    epochs: int = ranged(2, POSITIVE_COUNT)
    """Passes over the demonstrations; more overfits, which narrows what PPO can explore later."""
    batch_size: int = ranged(8, POSITIVE_COUNT)
    """Examples per forward pass (per process)."""
    gradient_accumulation_steps: int = ranged(1, POSITIVE_COUNT)
    """Forward passes whose gradients add up to one optimizer step."""
    max_length: int = ranged(512, POSITIVE_COUNT)
    """Longest prompt + answer in tokens; longer examples lose the start of the prompt, then the end of the answer."""
    weight_decay: float = ranged(0.0, at_least(0))
    """AdamW weight decay."""
    warmup_ratio: float = ranged(0.1, SHARE)
    """Share of the optimizer steps over which the learning rate rises linearly from 0, before a linear decay."""
    max_grad_norm: float = ranged(1.0, above(0, "always clipped"))
    """Gradients are clipped to this global norm."""
    seed: int = ranged(0, SEED)
    """Seed of the shuffling and of any dropout."""
    engine: Literal["ddp", "fsdp2"] = "ddp"
    """How the processes of torchrun / accelerate launch hold the model: "ddp" (each whole: accelerate, or what
    `accelerate launch` was configured with) or "fsdp2" (torch's fully_shard per decoder layer; rlhf.fsdp2)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.engine not in TRAINING_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(TRAINING_ENGINES)}, not {self.engine!r}")
