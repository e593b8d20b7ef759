"""Frozen features of answers: pooled hidden states of one layer of a backbone, each text computed once (in memory,
and across rounds in a cache folder: rlhf.reward.feature_cache), for the head strategies and the bootstrap heads
(rlhf.reward.strategies)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from rlhf.decode import position_ids_from_mask
from rlhf.losses import masked_mean
from rlhf.reward.data import PreferencePair, pad_pair_rows, tokenize_pairs
from rlhf.reward.feature_cache import FeatureFile, text_key
from rlhf.reward.model import RewardModel, load_reward_model, load_reward_tokenizer, truncated_decoder


def parse_feature(feature: str) -> tuple[str, int]:
    """"mean@-1" -> ("mean", -1); pooling is "last" or "mean", the layer an index into hidden_states."""
    pooling, _, layer = feature.partition("@")
    if pooling not in ("last", "mean") or not layer.lstrip("-").isdigit():
        raise ValueError(f"feature must look like 'last@-1' or 'mean@12' (pooling@layer), not {feature!r}")
    return pooling, int(layer)


def canonical_feature(feature: str, n_layers: int) -> str:
    """The feature with its layer as RewardModel's `layer` reads it: 0 <= L < n_layers, or -1 for the final output.

    hidden_states has n_layers + 1 entries and its last one is the final norm's output, so "mean@30" of a 30-layer
    decoder is "mean@-1", and "mean@-2" is "mean@29". A layer past a shallow model's last (the default feature on
    a model smaller than the one it was measured on) reads its final output.
    """
    pooling, layer = parse_feature(feature)
    if layer < -(n_layers + 1):
        raise ValueError(f"feature {feature!r}: this model has hidden states 0..{n_layers} (or -1 for the last)")
    layer = min(layer, n_layers) % (n_layers + 1)
    return f"{pooling}@{-1 if layer == n_layers else layer}"


class FeatureExtractor:
    """Pooled hidden states of a frozen backbone for (prompt, answer) texts, each text pair computed once: in memory,
    and across rounds in `cache_folder` (rlhf.reward.feature_cache) when the backbone is a model folder's."""

    def __init__(self, reward_model: RewardModel, tokenizer, batch_size: int = 16, max_length: int = 512,
                 cache_folder: str | Path | None = None, model_path: str | Path | None = None):
        self.reward_model = reward_model.eval()
        self.reward_model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self._cache: dict[tuple[str, str, str], torch.Tensor] = {}
        self._files: dict[str, FeatureFile] = {}
        self.cache_folder, self.model_path = cache_folder, model_path
        self.computed = 0
        """Texts whose features the backbone computed (the cost); `reused` were read from the cache folder."""
        self.reused = 0

    @classmethod
    def from_model(cls, model: str, batch_size: int = 16, max_length: int = 512,
                   cache_folder: str | Path | None = None) -> "FeatureExtractor":
        """The backbone of a causal LM (base or policy) or of a saved reward model folder; its features kept in
        `cache_folder` between runs when given."""
        from rlhf.models import resolve_model_path

        path = resolve_model_path(model)
        return cls(load_reward_model(None, path), load_reward_tokenizer(None, path), batch_size, max_length,
                   cache_folder=cache_folder, model_path=path)

    def _file(self, feature: str) -> FeatureFile | None:
        if self.cache_folder is None or self.model_path is None:
            return None
        if feature not in self._files:
            self._files[feature] = FeatureFile(self.cache_folder, self.model_path, feature, self.max_length)
        return self._files[feature]

    def features(self, prompts: Sequence[str], answers: Sequence[str], feature: str) -> torch.Tensor:
        """(N, D) float32 features of each prompt + answer: from memory, then the cache folder, then the backbone."""
        keys = [(feature, p, a) for p, a in zip(prompts, answers)]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        stored = self._file(feature)
        if missing and stored is not None:
            found = stored.get([text_key(k[1], k[2]) for k in missing])
            for key in missing:
                if (row := found.get(text_key(key[1], key[2]))) is not None:
                    self._cache[key] = row
            self.reused += len(found)
            missing = [k for k in missing if k not in self._cache]
        if missing:
            computed = self.compute([k[1] for k in missing], [k[2] for k in missing], [feature])[feature]
            self._cache.update(zip(missing, computed))
            self.computed += len(missing)
            if stored is not None:
                stored.add({text_key(k[1], k[2]): row for k, row in zip(missing, computed)})
        return torch.stack([self._cache[k] for k in keys])  # (N, D)

    def backbone_through(self, layer: int) -> tuple[nn.Module, int]:
        """(backbone, depth) computing hidden_states[0..layer] (0 <= layer <= the layer count, which is the final
        output): for an inner layer of a Llama-style decoder only its first `layer` decoder layers, whose output is
        hidden_states[depth = layer] (rlhf.reward.model.truncated_decoder, the same weights: a mean@2 feature of a
        30-layer model costs 2 layers, not 30); else the whole backbone and depth -1 (its final output)."""
        backbone = self.reward_model.backbone
        if layer >= backbone.config.num_hidden_layers:
            return backbone, -1
        try:
            return truncated_decoder(backbone, layer), layer
        except ValueError:  # no .layers and .norm: hidden_states of the whole forward
            return backbone, -1

    @torch.inference_mode()
    def compute(self, prompts: Sequence[str], answers: Sequence[str], features: Sequence[str]) -> dict:
        """{feature: (N, D)} for several features from one pass per batch (uncached: the bench stores its own)."""
        n_layers = self.reward_model.backbone.config.num_hidden_layers
        specs = {f: parse_feature(canonical_feature(f, n_layers)) for f in features}
        backbone, depth = self.backbone_through(max(layer % (n_layers + 1) for _, layer in specs.values()))
        inner = any(layer not in (-1, depth) for _, layer in specs.values())
        tokenized = tokenize_pairs(self.tokenizer, [PreferencePair(p, a, a) for p, a in zip(prompts, answers)],
                                   self.max_length)
        order = sorted(range(len(tokenized)), key=lambda i: len(tokenized[i].chosen_ids))  # little padding a batch
        out = {f: [None] * len(tokenized) for f in features}
        device = next(self.reward_model.parameters()).device
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            ids, mask, answer_mask = pad_pair_rows([tokenized[i] for i in batch], self.tokenizer.pad_token_id,
                                                   answers=("chosen",))  # the answer is each pair's chosen one
            ids, mask = ids.to(device), mask.to(device)  # (B, L) right-padded; answer_mask stays on the CPU
            output = backbone(
                input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                output_hidden_states=inner, use_cache=False,
            )  # hidden_states: tuple of (B, L, D), embeddings first, the final output last
            last = mask.sum(1) - 1  # (B,) last real token (right padding)
            for name, (pooling, layer) in specs.items():
                # the final output from last_hidden_state: a truncated decoder (a saved mean@L model, or the one
                # backbone_through runs) has no inner layer to capture, its output is hidden_states[L] of the whole
                hidden = output.last_hidden_state if layer in (-1, depth) else output.hidden_states[layer]
                hidden = hidden.float().cpu()
                if pooling == "last":
                    pooled = hidden[torch.arange(len(batch)), last.cpu()]  # (B, D)
                else:
                    pooled = masked_mean(hidden, answer_mask.unsqueeze(-1), dim=1)  # (B, D)
                for r, i in enumerate(batch):
                    out[name][i] = pooled[r].clone()
        return {name: torch.stack(values) for name, values in out.items()}  # (N, D) each
