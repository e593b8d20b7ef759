"""What a model's memory depends on, read from its config alone: the model is built on the meta device (no weights
are read or allocated), its parameters counted, its dimensions taken from the config (rlhf.memory_plan uses them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

LORA_EXCLUDED = {"lm_head", "v_head", "score"}
"""Output layers, never given adapters (as rlhf.ppo.train.HEAD_NAMES)."""


@dataclass(frozen=True)
class ModelShape:
    """Counts and dimensions of one causal LM (rlhf.memory_plan's input)."""

    name: str
    parameters: int
    """Parameters of the causal LM, tied embeddings counted once."""
    embedding_parameters: int
    """Parameters outside the decoder layers: embeddings, final norm, an untied LM head."""
    layer_parameters: int
    """Parameters of one decoder layer (the largest, when they differ)."""
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    """Key (or value) features per token: key-value heads x head dimension."""
    vocab: int
    lora_per_rank: int
    """LoRA parameters per unit of rank in one decoder layer: the sum of in + out features of its linear layers."""
    lm_head_parameters: int = 0
    """An untied LM head's parameters (0 when tied: the head is the embedding matrix)."""

    def backbone_parameters(self, layers: int) -> int:
        """Parameters of the decoder cut to its first `layers` layers (a reward model on an inner layer, and the critic
        that starts from it), without an untied LM head."""
        return self.embedding_parameters - self.lm_head_parameters + layers * self.layer_parameters


def model_config(name_or_path: str | Path, local_only: bool = False):
    """The transformers config of `--model` ("default", a folder (config.json is enough), a hub name), text part
    only; a folder of LoRA adapters reads its base model's. `local_only`: never ask the hub (a hub name must be in the
    local cache)."""
    from transformers import AutoConfig

    from rlhf.models import adapter_base_path, is_adapter_folder, resolve_model_path

    path = resolve_model_path(name_or_path)
    if is_adapter_folder(path):
        path = resolve_model_path(adapter_base_path(path))
    config = AutoConfig.from_pretrained(path, local_files_only=local_only)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def shape_from_config(config, name: str = "") -> ModelShape:
    """The ModelShape of the causal LM `config` describes, counted on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    layers = decoder_layers(model)
    per_layer = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    in_layers = sum(p.numel() for layer in layers for p in layer.parameters())
    head = model.get_output_embeddings()
    untied = head is not None and head.weight is not model.get_input_embeddings().weight
    head_parameters = head.weight.numel() if untied else 0
    lora = max(sum(m.in_features + m.out_features for n, m in layer.named_modules()
                   if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] not in LORA_EXCLUDED) for layer in layers)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return ModelShape(name=name or getattr(config, "_name_or_path", "") or config.model_type, parameters=total,
                      embedding_parameters=total - in_layers, layer_parameters=per_layer, layers=len(layers),
                      hidden=config.hidden_size,
                      intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
                      kv_width=kv_heads * head_dim, vocab=config.vocab_size, lora_per_rank=lora,
                      lm_head_parameters=head_parameters)


def decoder_layers(model) -> nn.ModuleList:
    """The decoder's layers: the longest ModuleList in the model (Llama's model.layers, GPT-2's transformer.h)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of decoder layers to count")
    return max(lists, key=len)
