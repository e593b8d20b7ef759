"""Generation settings built from scratch: nothing from a model's own generation_config.json reaches our sampling.

transformers fills every GenerationConfig field left None from the model's `generation_config` (then from its
global defaults, where top_k is 50): a checkpoint that ships `repetition_penalty` 1.1, `no_repeat_ngram_size`,
`min_p`, `top_k`, `suppress_tokens`... would add those processors to every `generate()` call. PPO's log-probs are
those of the distribution it samples from (rlhf.warping), and pairs are sampled with [sampling]'s settings
only, so both generate through `generate_with`: every processor field set to its neutral value (`NEUTRAL`), and
the model's own generation config blanked for the call, because several fields (min_p, suppress_tokens, forced
BOS/EOS, sequence_bias...) have no neutral value but None, which transformers would fill from the model.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from transformers import GenerationConfig

NEUTRAL = dict(
    temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
    repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
    min_new_tokens=0, guidance_scale=1.0, renormalize_logits=False, remove_invalid_values=False,
    num_beams=1, num_return_sequences=1, length_penalty=1.0,
)
"""Every logits-processor field of GenerationConfig at a value that adds no processor (min_length is left out: a set
min_new_tokens overwrites it with the prompt's length, and setting both makes generate() warn). The fields whose only
neutral value is None are listed in `NONE_ONLY`; `generate_with` keeps the model's values of those out."""
NONE_ONLY = ("min_p", "top_h", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
             "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
             "watermarking_config", "stop_strings", "max_time")
"""Fields that act whenever they are not None (transformers' `_get_logits_processor` and stopping criteria)."""


def neutral_generation_config(**settings) -> GenerationConfig:
    """A GenerationConfig with every processor neutral except `settings` (do_sample, temperature, max_new_tokens...).

    Pass it to `generate_with`: by itself it still lets a model's values of the `NONE_ONLY` fields in.
    """
    unknown = set(settings) - set(GenerationConfig().to_dict())
    if unknown:
        raise TypeError(f"not GenerationConfig fields: {sorted(unknown)}")
    return GenerationConfig(**{**NEUTRAL, "use_cache": True, **settings})


def _transformers_model(model):
    """The model `generate()` reads `generation_config` from: a peft model's base model, else the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def model_generation_config_ignored(model) -> Iterator[None]:
    """Within: the model's `generation_config` is blank, so generate() takes nothing from it; restored on exit.

    Not thread-safe on one model object: one generate() at a time per model, as everywhere in this project.
    """
    target = _transformers_model(model)
    shipped = target.generation_config
    target.generation_config = GenerationConfig()
    try:
        yield
    finally:
        target.generation_config = shipped


def generate_with(model, generation_config: GenerationConfig, **inputs):
    """`model.generate(**inputs, generation_config=...)` with exactly these settings: none of the model's own."""
    with model_generation_config_ignored(model):
        return model.generate(generation_config=generation_config, **inputs)
