"""How an answer is sampled: one `Sampling` for the pairs people rank ([sampling] of rlhf-loop.toml), PPO's rollouts
and its log-probs ([ppo.sampling]) and the generation_config.json of a saved policy. Importable without torch.

Nothing else shapes sampling: a model's own generation_config.json (a shipped repetition penalty, top-k, min-p...) is
never read (rlhf.decode samples with these settings alone), so what PPO optimises is what it sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.settings_range import POSITIVE_COUNT, above, at_least, between, check_ranges, ranged

DEFAULT_BATCH_SIZE = 32
"""Sequences generated together in one left-padded batch when answers are made for people (docs/benchmarks.md,
"Generation speed": 32 made 126 tokens/s against 96 at 16 on the default model, one core; 64 made no more)."""


@dataclass
class Sampling:
    """How each next token is chosen, in transformers' order: EOS held back before min_new_tokens, the repetition
    penalty on the answer's tokens, then temperature, top-k and top-p. The defaults are the pairs people rank
    (whole answers: docs/benchmarks.md, "Whole answers"); PPO's are set on its own field."""

    max_new_tokens: int = ranged(512, POSITIVE_COUNT)
    """Limit on generated tokens per answer; an answer that reaches it without EOS finishes with "length"."""
    temperature: float = ranged(0.7, at_least(0, "0: greedy"))
    """Softmax temperature; 0 means greedy decoding (no sampling)."""
    top_k: int = ranged(0, at_least(0, "0: off"))
    """Keep only the k most likely tokens before sampling (0 disables it)."""
    top_p: float = ranged(0.95, between(0, 1, "1: off", low_open=True))
    """Nucleus sampling: keep the smallest set of tokens whose probability adds up to top_p (1.0 keeps all)."""
    min_new_tokens: int = ranged(0, at_least(0, "0: off"))
    """EOS cannot be sampled before this many tokens (0: off)."""
    repetition_penalty: float = ranged(1.1, above(0, "1: off"))
    """CTRL's penalty on tokens already in the answer (the prompt's are not counted, so its words and the chat
    template's EOS stay free); 1.0 disables it; 1.2 already derails."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens cannot exceed max_new_tokens")

    @property
    def greedy(self) -> bool:
        """The most likely token every step: nothing is drawn."""
        return self.temperature <= 0

    @property
    def is_identity(self) -> bool:
        """Whether the raw logits are the sampling distribution (temperature 1, nothing removed or penalised)."""
        return (self.temperature == 1.0 and self.top_k <= 0 and self.top_p >= 1.0 and self.min_new_tokens <= 0
                and self.repetition_penalty == 1.0)
