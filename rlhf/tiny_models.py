"""Tiny random chat models of the architectures teams bring, built locally from configs (nothing is downloaded).

Each family is a 2-layer model (hidden 32) of its real architecture, with the SmolLM2 tokenizer dressed as the
family's tokenizer: the family's special tokens added, its BOS/EOS/pad, and a chat template in its style. The
special-token set-ups are the awkward ones real checkpoints ship, so the tests meet them:

    family   architecture        end of turn       EOS              pad              embeddings
    llama    LlamaForCausalLM    <|eot_id|>        <|end_of_text|>  none             untied
    qwen2    Qwen2ForCausalLM    <|im_end|>        <|im_end|>       <|endoftext|>    tied, rows > tokens
    gemma3   Gemma3ForCausalLM   <end_of_turn>     <eos>            <pad>            tied, sliding window
    phi3     Phi3ForCausalLM     <|end|>           <|endoftext|>    = EOS            untied
    mistral  MistralForCausalLM  </s>              </s>             none             untied

Each folder's generation_config.json lists the EOS only, so the end-of-turn token must be found from the chat
template (rlhf.models.prepare_model_and_tokenizer does). `python -m rlhf.tiny_models OUT_DIR` writes them all.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST] {{ message['content'] }} "
    "[/INST]{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    """How to dress a tiny model as one family: its config and its tokenizer's special tokens and template."""

    name: str
    """Short name used in test ids and folder names."""
    config_class: type[PretrainedConfig]
    """The architecture's config; AutoModelForCausalLM picks the model class from it."""
    chat_template: str
    """A Jinja chat template in the family's style."""
    special_tokens: tuple[str, ...]
    """Tokens added to the SmolLM2 tokenizer as special tokens (those it lacks are appended to the vocabulary)."""
    eos: str
    """The tokenizer's EOS, and the only id in generation_config.json's eos_token_id."""
    bos: str | None = None
    """The tokenizer's BOS (None: the family has none, as Qwen)."""
    pad: str | None = None
    """The tokenizer's pad token (None: the family ships none, as Llama 3 and Mistral)."""
    unk: str | None = None
    """The tokenizer's unknown token, where the family has one."""
    tie_word_embeddings: bool = False
    """Whether the output matrix is the embedding matrix."""
    extra_rows: int = 0
    """Embedding rows beyond the tokenizer's tokens (Qwen2.5 ships 151936 rows for 151665 tokens)."""
    config: dict = field(default_factory=dict)
    """Extra config arguments of the architecture."""


FAMILIES: dict[str, Family] = {family.name: family for family in [
    Family("llama", LlamaConfig, LLAMA3_TEMPLATE,
           ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
           eos="<|end_of_text|>", bos="<|begin_of_text|>"),
    Family("qwen2", Qwen2Config, QWEN2_TEMPLATE, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
           eos="<|im_end|>", pad="<|endoftext|>", tie_word_embeddings=True, extra_rows=64),
    Family("gemma3", Gemma3TextConfig, GEMMA_TEMPLATE, ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
           eos="<eos>", bos="<bos>", pad="<pad>", tie_word_embeddings=True,
           config=dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                       layer_types=["sliding_attention", "full_attention"])),
    Family("phi3", Phi3Config, PHI3_TEMPLATE,
           ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
           eos="<|endoftext|>", bos="<s>", pad="<|endoftext|>", unk="<unk>"),
    Family("mistral", MistralConfig, MISTRAL_TEMPLATE, ("<unk>", "<s>", "</s>"), eos="</s>", bos="<s>", unk="<unk>",
           config=dict(sliding_window=None)),
]}


def family_tokenizer(family: Family, base_tokenizer):
    """A copy of `base_tokenizer` with the family's special tokens, BOS/EOS/pad/unk and chat template."""
    tokenizer = copy.deepcopy(base_tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tokenizer.bos_token, tokenizer.eos_token = family.bos, family.eos
    tokenizer.pad_token, tokenizer.unk_token = family.pad, family.unk
    tokenizer.chat_template = family.chat_template
    return tokenizer


def _token_id(tokenizer, token: str | None) -> int | None:
    return None if token is None else tokenizer.convert_tokens_to_ids(token)


def build_family_model(family: str | Family, out_dir: str | Path, base_tokenizer, seed: int = 0,
                       max_position_embeddings: int = 2048, **config) -> Path:
    """Save a tiny random model of `family` (2 layers, hidden 32) with its dressed tokenizer to `out_dir`.

    `config` overrides any config argument (a short context: `max_position_embeddings=64`).
    """
    family = FAMILIES[family] if isinstance(family, str) else family
    tokenizer = family_tokenizer(family, base_tokenizer)
    vocab_size = len(tokenizer) + family.extra_rows
    ids = dict(bos_token_id=_token_id(tokenizer, family.bos), eos_token_id=_token_id(tokenizer, family.eos),
               pad_token_id=_token_id(tokenizer, family.pad))
    arguments = dict(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=family.tie_word_embeddings, **ids,
    )
    arguments.update(family.config)
    arguments.update(config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family.config_class(**arguments))
    # as many checkpoints ship it: only the EOS stops generation, not the chat template's end of turn
    model.generation_config = GenerationConfig(**ids)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Write every family under OUT_DIR/<family>, with the default model's tokenizer."""
    from transformers import AutoTokenizer

    from rlhf.models import resolve_model_path

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m rlhf.tiny_models OUT_DIR", file=sys.stderr)
        return 2
    base = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    for name in FAMILIES:
        print(build_family_model(name, Path(argv[0]) / name, base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
