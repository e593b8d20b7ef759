"""The reward model: a causal LM's decoder plus a linear value head (DeepSpeed-Chat step 2).

`forward_value` gives a value per position (B, L) and the sequence score (B,). The score definition is
saved with the model: `pooling` "last" reads the value at each sequence's last real token (DeepSpeed-Chat),
"mean" averages the values over the answer's tokens; `layer` -1 reads the decoder's final, normed output,
a layer L >= 0 runs only the first L decoder layers and reads their output before the final norm (what
`hidden_states[L]` holds in transformers), so a head fitted on frozen mid-layer features exports exactly
and scores in a fraction of the full model's time. The per-position values are what a PPO critic needs,
so the critic is initialised from a trained reward model with the same class (as DeepSpeed-Chat does).

A saved reward model is a folder holding the backbone (`save_pretrained`, safetensors, loadable on its
own with `AutoModel`), the head in `v_head.safetensors`, the tokenizer, and `reward_model.json`, which
marks the folder as a reward model and records where it came from.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from rlhf.decode import position_ids_from_mask
from rlhf.folders import written_atomically
from rlhf.losses import last_token_scores, masked_mean
from rlhf.models import (
    ModelNotFoundError,
    cache_argument,
    load_causal_lm,
    load_tokenizer,
)

MARKER_FILE = "reward_model.json"
HEAD_FILE = "v_head.safetensors"
FORMAT_NAME = "rlhf-loop reward model"
FORMAT_VERSION = 1


POOLINGS = ("last", "mean")
"""How a sequence's score is read from its per-position values: at the last real token, or averaged over the answer."""


@dataclass
class RewardOutput:
    """What `RewardModel.forward_value` returns."""

    values: torch.Tensor
    """(B, L) value of every position (a critic's V(s_t)); padding positions hold meaningless numbers."""
    scores: torch.Tensor | None
    """(B,) the reward of prompt + answer; None from a mean-pooled model called without an answer mask (a
    critic needs only the values)."""
    head_scores: torch.Tensor | None = None
    """(B, H) each row's score under each of the `heads` (H, D) that `forward_value` was given, read from the same
    hidden states and pooled as `scores` are; None without heads."""


def is_reward_model_dir(path: str | os.PathLike) -> bool:
    """True when `path` is a folder written by `RewardModel.save_pretrained`."""
    return (Path(path) / MARKER_FILE).is_file()


class PassThroughNorm(nn.Module):
    """Stands in for a decoder's final norm when the score reads an inner layer: returns its input unchanged.

    It keeps the norm's weights as buffers under the same names, so a truncated decoder saves and loads like
    any other (no missing keys), while optimisers and DDP, which look at parameters, never see them.
    """

    def __init__(self, norm: nn.Module):
        super().__init__()
        for name, tensor in [*norm.named_parameters(recurse=False), *norm.named_buffers(recurse=False)]:
            self.register_buffer(name, tensor.detach())

    def forward(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden


def truncated_decoder(backbone: PreTrainedModel, n_layers: int) -> PreTrainedModel:
    """A decoder that runs only the first `n_layers` layers of `backbone` and skips its final norm.

    Its output is `backbone`'s hidden_states[n_layers] (for n_layers below the layer count). It is a new
    module sharing `backbone`'s weights (no copy, `backbone` itself is left whole); its config says
    n_layers, so `save_pretrained` writes a small model that `AutoModel` loads back. Decoders that keep
    their layers in `.layers` and the final norm in `.norm` (Llama, Mistral, Qwen2, ...) are supported.
    """
    layers, norm = getattr(backbone, "layers", None), getattr(backbone, "norm", None)
    if not isinstance(layers, nn.ModuleList) or not isinstance(norm, nn.Module):
        raise ValueError(f"{type(backbone).__name__} keeps no .layers and .norm: a score on an inner layer needs a "
                         "Llama-style decoder; use layer -1 (the final output) with this model.")
    if not 0 <= n_layers <= len(layers):
        raise ValueError(f"layer must be -1 or between 0 and {len(layers)} for this decoder, not {n_layers}")
    truncated = copy.copy(backbone)  # a new module object over the same parameters
    for table in ("_parameters", "_buffers", "_modules"):  # its own tables, so the changes below stay its own
        truncated.__dict__[table] = dict(backbone.__dict__[table])
    truncated.config = copy.deepcopy(backbone.config)
    truncated.config.num_hidden_layers = n_layers
    if isinstance(getattr(truncated.config, "layer_types", None), list):
        truncated.config.layer_types = truncated.config.layer_types[:n_layers]
    truncated.layers = nn.ModuleList(list(layers)[:n_layers])
    truncated.norm = norm if isinstance(norm, PassThroughNorm) else PassThroughNorm(norm)
    return truncated


def answer_mean_scores(values: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean of the values (B, L) over each row's answer positions (answer_mask (B, L) 1 there)."""
    return masked_mean(values, answer_mask, dim=-1)  # (B,)


class RewardModel(nn.Module):
    """Backbone (a decoder returning hidden states, as `AutoModel` loads it) plus `v_head: D -> 1`, no bias.

    `pooling` and `layer` define the score (module docstring); a layer L >= 0 keeps only the backbone's first
    L decoder layers (`truncated_decoder`, sharing the given backbone's weights).
    """

    def __init__(self, backbone: PreTrainedModel, v_head: nn.Linear | None = None, info: dict | None = None,
                 pooling: str = "last", layer: int = -1):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if layer < -1:
            raise ValueError(f"layer must be -1 (the final output) or a decoder layer count >= 0, not {layer}")
        self.pooling, self.layer = pooling, layer
        self.backbone = backbone if layer == -1 else truncated_decoder(backbone, layer)
        hidden_size = backbone.config.hidden_size
        self.v_head = v_head if v_head is not None else nn.Linear(hidden_size, 1, bias=False)
        if self.v_head.in_features != hidden_size or self.v_head.out_features != 1:
            raise ValueError(f"v_head must map {hidden_size} -> 1, got {self.v_head.in_features} -> "
                             f"{self.v_head.out_features}")
        self.v_head.to(device=self._backbone_device(), dtype=self._backbone_dtype())
        self.info: dict[str, Any] = dict(info or {})  # provenance for reward_model.json: base model, settings, metrics

    # ---- construction -------------------------------------------------------------------------------

    @classmethod
    def from_causal_lm(cls, name_or_path: str | os.PathLike, dtype: torch.dtype | None = None) -> "RewardModel":
        """A new reward model on the decoder of a causal LM (the base model or an SFT policy); the head is random.

        The LM head is dropped: only the decoder's hidden states are used, as `AutoModel` would load them.
        """
        causal_lm = load_causal_lm(name_or_path, dtype=dtype)
        backbone = causal_lm.base_model
        if backbone is causal_lm:
            raise ValueError(f"{name_or_path}: cannot find the decoder inside {type(causal_lm).__name__}")
        return cls(backbone, info={"base_model": str(name_or_path)})

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | None = None) -> "RewardModel":
        """Load a folder written by `save_pretrained`; scores come back identical."""
        path = Path(path)
        if not is_reward_model_dir(path):
            raise ModelNotFoundError(
                f"{path} is not a reward model folder (no {MARKER_FILE} there). Pass a folder saved by "
                "`python app.py --train-reward`, or start from a causal LM instead."
            )
        info = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        if info.get("format") != FORMAT_NAME or int(info.get("version", 0)) > FORMAT_VERSION:
            raise ModelNotFoundError(f"{path / MARKER_FILE} is not a reward model marker this version can read.")
        backbone = AutoModel.from_pretrained(path, dtype=dtype or torch.float32)
        head_weight = load_file(str(path / HEAD_FILE))["weight"]  # (1, D)
        v_head = nn.Linear(head_weight.shape[1], 1, bias=False)
        with torch.no_grad():
            v_head.weight.copy_(head_weight)
        # folders from before the score definition was saved score at the last token of the final output
        return cls(backbone, v_head, info=info.get("info", {}), pooling=info.get("pooling", "last"),
                   layer=int(info.get("layer", -1)))

    def save_pretrained(self, path: str | os.PathLike, tokenizer=None, state_dict: dict | None = None) -> Path:
        """Write backbone, head, tokenizer and marker to `path`, atomically: a crash leaves no half folder.

        `state_dict` (this module's, keys "backbone.*" and "v_head.weight") replaces the weights held here: under
        DeepSpeed ZeRO-3 or FSDP each process holds a shard, and `accelerator.get_state_dict` gathers the whole.
        """
        path = Path(path)
        with written_atomically(path) as staging:
            backbone_state = None if state_dict is None else {
                key.removeprefix("backbone."): value for key, value in state_dict.items() if key.startswith("backbone.")}
            self.backbone.save_pretrained(staging, safe_serialization=True, state_dict=backbone_state)
            head = (self.v_head.weight if state_dict is None else state_dict["v_head.weight"])
            head = head.detach().to("cpu", torch.float32).contiguous()  # (1, D)
            save_file({"weight": head}, str(staging / HEAD_FILE))
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            marker = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "head_file": HEAD_FILE,
                      "hidden_size": int(head.shape[1]), "backbone_class": type(self.backbone).__name__,
                      "pooling": self.pooling, "layer": self.layer, "info": self.info}
            (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2, default=str), encoding="utf-8")
        return path

    # ---- use -----------------------------------------------------------------------------------------

    def forward_value(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      answer_mask: torch.Tensor | None = None, heads: torch.Tensor | None = None) -> RewardOutput:
        """Values at every position and each row's score; left or right padding.

        answer_mask (B, L), 1 on the answer's tokens (its EOS included), is what a mean-pooled score averages
        over; without it such a model returns the values only (scores None). Last-token scores ignore it.
        `heads` (H, D), linear heads on the same features as v_head (a head strategy's bootstrap heads), add each
        row's score under each of them (head_scores, fp32 whatever the autocast: one small matmul); values and scores
        are unchanged.
        """
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state  # (B, L, D)
        values = self.v_head(hidden).squeeze(-1)  # (B, L)
        output = RewardOutput(values=values, scores=self.scores_from_values(values, attention_mask, answer_mask))
        if heads is not None and output.scores is not None:  # a mean pooling needs the answer mask
            with torch.autocast(hidden.device.type, enabled=False):  # fp32: their spread is a small difference
                head_values = hidden.float() @ heads.float().T  # (B, L, H)
            output.head_scores = torch.stack([self.scores_from_values(head_values[..., h], attention_mask, answer_mask)
                                              for h in range(heads.shape[0])], dim=-1)  # (B, H)
        return output

    def scores_from_values(self, values: torch.Tensor, attention_mask: torch.Tensor,
                           answer_mask: torch.Tensor | None) -> torch.Tensor | None:
        """(B,) the score of each row under this model's pooling, from its values (B, L)."""
        if self.pooling == "last":
            return last_token_scores(values, attention_mask)  # (B,)
        return None if answer_mask is None else answer_mean_scores(values, answer_mask)  # (B,)

    def forward_shared_prompt(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
    ) -> RewardOutput:
        """Values and scores of answers that continue shared prompts, each prompt run through the backbone once.

        prompt_ids/prompt_mask (N, P) are LEFT-padded; answer_ids/answer_mask (kN, A) are RIGHT-padded, and
        answer row r continues prompt row r % N (for pairs, k = 2: chosen rows [0, N), rejected rows [N, 2N)).
        The result covers the answer positions only: values (kN, A), scores (kN,), the same numbers as
        `forward_value` on the concatenated rows (the prompt's keys and values are reused from a cache,
        and gradients flow back through them).
        """
        n_prompts, prompt_len = prompt_ids.shape
        if answer_ids.shape[0] % n_prompts:
            raise ValueError(f"{answer_ids.shape[0]} answer rows do not split evenly over {n_prompts} prompts")
        prompt_out = self.backbone(
            input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
            use_cache=True,
        )
        cache = prompt_out["cache"] if "cache" in prompt_out else prompt_out["past_key_values"]
        rows = torch.arange(answer_ids.shape[0], device=answer_ids.device) % n_prompts  # (kN,) prompt of each answer
        cache.batch_select_indices(rows)
        full_mask = torch.cat([prompt_mask[rows], answer_mask], dim=1)  # (kN, P + A)
        hidden = self.backbone(
            input_ids=answer_ids, attention_mask=full_mask,
            position_ids=position_ids_from_mask(full_mask)[:, prompt_len:],
            use_cache=True, **{cache_argument(self.backbone): cache},
        ).last_hidden_state  # (kN, A, D)
        values = self.v_head(hidden).squeeze(-1)  # (kN, A)
        # the rows are the answers alone: their last real token, or the mean over all of them
        return RewardOutput(values=values, scores=self.scores_from_values(values, answer_mask, answer_mask))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_ids: torch.Tensor | None = None,
        prompt_mask: torch.Tensor | None = None,
    ) -> RewardOutput:
        """`forward_value(input_ids, ...)`, or with prompts `forward_shared_prompt(prompt_ids, ..., input_ids, ...)`.

        Training calls the module rather than the methods because accelerate's wrappers (DDP, autocast) sit
        on `forward`.
        """
        if prompt_ids is None:
            return self.forward_value(input_ids, attention_mask)
        return self.forward_shared_prompt(prompt_ids, prompt_mask, input_ids, attention_mask)

    def freeze_backbone(self) -> None:
        """Train the value head only (a linear probe on the decoder's features)."""
        self.backbone.requires_grad_(False)

    def gradient_checkpointing_enable(self) -> None:
        """Trade compute for memory in the backbone during training."""
        self.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def _backbone_device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def _backbone_dtype(self) -> torch.dtype:
        return next(self.backbone.parameters()).dtype


def load_reward_model(
    warm_start: str | os.PathLike | None, model: str | os.PathLike, dtype: torch.dtype | None = None
) -> RewardModel:
    """The reward model a training run starts from: `warm_start` (a reward model folder) when given, else `model`.

    `model` may itself be a reward model folder (then it is loaded whole) or any causal LM (base or SFT).
    """
    if warm_start:
        return RewardModel.from_pretrained(warm_start, dtype=dtype)
    if is_reward_model_dir(model):
        return RewardModel.from_pretrained(model, dtype=dtype)
    return RewardModel.from_causal_lm(model, dtype=dtype)


def load_reward_tokenizer(warm_start: str | os.PathLike | None, model: str | os.PathLike):
    """The tokenizer that goes with `load_reward_model`'s choice (saved alongside a reward model)."""
    source = warm_start or model
    if is_reward_model_dir(source) and not (Path(source) / "tokenizer_config.json").is_file():
        raise ModelNotFoundError(f"{source} holds no tokenizer; save reward models with their tokenizer.")
    return load_tokenizer(source)
