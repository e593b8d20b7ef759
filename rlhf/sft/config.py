"""The SFT settings ([sft] of rlhf-loop.toml), importable without torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SFTConfig:
    """Settings of one SFT run."""

    learning_rate: float = 5e-5
    """AdamW peak learning rate (about 5e-5 is the usual choice for 1 to 3 epochs)."""
    epochs: int = 2
    """Passes over the demonstrations; more overfits, which narrows what PPO can explore later."""
    batch_size: int = 8
    """Examples per forward pass (per process)."""
    gradient_accumulation_steps: int = 1
    """Forward passes whose gradients add up to one optimizer step."""
    max_length: int = 512
    """Longest prompt + answer in tokens; longer examples lose the start of the prompt, then the end of the answer."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_ratio: float = 0.1
    """Share of the optimizer steps over which the learning rate rises linearly from 0, before a linear decay."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    seed: int = 0
    """Seed of the shuffling and of any dropout."""
