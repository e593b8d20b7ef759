"""LP-FT: a linear probe, then the features under it fine-tuned (Kumar et al. 2022, "Fine-Tuning can Distort
Pretrained Features and Underperform Out-of-Distribution").

The "lpft" strategy first fits the Bradley-Terry head on frozen features, as "head" does (the linear probe), and
exports it as a RewardModel: the backbone's first L layers, the head as v_head. Then the top votes.finetune_layers of
those decoder layers (layer L and the ones just below it) are trained on the same votes with the head's own loss
(-log sigmoid(r_c - r_r - m), the graded margin m), everything else frozen: the head, so the first steps move the
features along it instead of undoing a head that a random start would first have to learn, and the layers below, so
a few hundred votes train a few million weights, not the whole model. docs/few-votes.md ("LP-FT") has the
measurements behind the step, the epochs and the one layer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from rlhf.losses import bradley_terry_loss
from rlhf.reward.config import StrategyConfig
from rlhf.reward.data import PairLike, pad_pair_rows, tokenize_pairs
from rlhf.reward.model import RewardModel


@dataclass(frozen=True)
class FinetuneSettings:
    """How `finetune_top_layers` trains; the round's come from [votes] and [reward] (`from_config`)."""

    lr: float
    """Adam's step for the fine-tuned layers."""
    epochs: int
    """Passes over the votes."""
    batch_pairs: int = 16
    """Votes per batch."""
    seed: int = 0
    """Seeds the order of the votes in each pass."""
    max_length: int = 512
    """Tokens per sequence (prompt + answer + EOS), cut as the reward model's training data is."""
    n_layers: int = 1
    """Decoder layers trained: the last ones the model reads."""

    @classmethod
    def from_config(cls, config: StrategyConfig) -> "FinetuneSettings":
        """votes.finetune_lr, finetune_epochs and finetune_layers, the strategy's seed and reward.max_length."""
        return cls(lr=config.votes.finetune_lr, epochs=config.votes.finetune_epochs, seed=config.seed,
                   max_length=config.reward.max_length, n_layers=config.votes.finetune_layers)


def finetune_top_layers(model: RewardModel, tokenizer, pairs: Sequence[PairLike], margins: torch.Tensor,
                        weights: torch.Tensor, settings: FinetuneSettings,
                        on_epoch: Callable[[int, float, RewardModel], None] | None = None) -> RewardModel:
    """A float32 copy of `model` whose last `settings.n_layers` decoder layers are trained on the votes `pairs`
    (chosen over rejected; margins and weights (N,) as the head had them, rlhf.losses.graded_terms) by Adam at
    `settings.lr` for `settings.epochs` passes in shuffled batches of `settings.batch_pairs`; v_head, the embeddings
    and every other layer stay as they are. `on_epoch(epoch, mean loss, model)` after each pass, the model in eval
    mode (to be measured, not changed). `model` itself is left untouched (it may share its weights with the feature
    extractor's backbone)."""
    epochs, n_layers, batch_pairs = settings.epochs, settings.n_layers, settings.batch_pairs
    if not pairs or epochs <= 0:
        raise ValueError(f"fine-tuning needs votes and at least one epoch, got {len(pairs)} votes, {epochs} epochs")
    available = len(model.backbone.layers)
    if available == 0:
        raise ValueError("LP-FT fine-tunes the decoder layers the feature reads, and a feature of layer 0 (the token "
                         "embeddings) reads none: use votes.feature mean@1 or deeper, or the head strategy.")
    if not 1 <= n_layers <= available:
        raise ValueError(f"the feature reads {available} decoder layers, so LP-FT can fine-tune 1 to {available} of "
                         f"them, not {n_layers}: set votes.finetune_layers in that range (or a deeper votes.feature).")
    tuned = copy.deepcopy(model).float()
    tuned.requires_grad_(False)
    trained = tuned.backbone.layers[-n_layers:]  # the last the score reads (layer -1: under the frozen final norm)
    trained.requires_grad_(True)
    optimizer = torch.optim.Adam(trained.parameters(), lr=settings.lr)
    tokenized = tokenize_pairs(tokenizer, pairs, settings.max_length)
    margins, weights = margins.float(), weights.float()
    device = next(tuned.parameters()).device
    generator = torch.Generator().manual_seed(settings.seed)
    tuned.train()
    for epoch in range(epochs):
        order = torch.randperm(len(tokenized), generator=generator).tolist()
        total = 0.0
        for start in range(0, len(order), batch_pairs):
            batch = order[start:start + batch_pairs]
            ids, mask, answer_mask = (t.to(device) for t in pad_pair_rows([tokenized[i] for i in batch],
                                                                           tokenizer.pad_token_id))
            scores = tuned.forward_value(ids, mask, answer_mask).scores  # (2B,)
            loss = bradley_terry_loss(scores[:len(batch)] - scores[len(batch):], margins[batch].to(device),
                                      weights[batch].to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
        if on_epoch is not None:
            tuned.eval()
            on_epoch(epoch + 1, total / len(order), tuned)
            tuned.train()
    tuned.eval()
    tuned.requires_grad_(False)
    return tuned
