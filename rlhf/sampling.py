"""How answers are sampled ([sampling] of rlhf-loop.toml), importable without torch; rlhf.generate says why the
defaults are what they are (finish rates measured on the default model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AnswerSampling:
    """How answers are sampled."""

    max_new_tokens: int = 512
    """Limit on generated tokens per answer; an answer that reaches it without EOS finishes with "length"."""
    temperature: float = 0.7
    """Softmax temperature; 0 means greedy decoding (no sampling)."""
    top_p: float = 0.95
    """Nucleus sampling: keep the smallest set of tokens whose probability adds up to top_p (1.0 keeps all)."""
    top_k: int = 0
    """Keep only the k most likely tokens before sampling (0 disables it)."""
    repetition_penalty: float = 1.1
    """CTRL's penalty on tokens already in the answer (the prompt is not counted: its words and the chat
    template's EOS stay free); applied to the logits before temperature, top-k and top-p (transformers' order). 1.0
    disables it; 1.2 already derails."""
    batch_size: int = 32
    """Sequences generated together in one left-padded batch (a prompt's answers share its KV). 32 made 126 tokens/s
    against 96 at 16 (default model, one core, fp32, 2 answers a prompt, 64 new tokens); 64 made no more."""
    seed: int | None = None
    """Seed for sampling, applied on a forked RNG so the caller's random state is left alone; None: not seeded."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0
