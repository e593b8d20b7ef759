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
from typing import Callable, Sequence

import torch

from rlhf.generate import pad_sequences
from rlhf.losses import bradley_terry_loss
from rlhf.reward.data import PairLike, TokenizedPair, tokenize_pairs
from rlhf.reward.model import RewardModel


def pad_pair_rows(pairs: Sequence[TokenizedPair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, answer_mask), each (2B, L) right-padded: rows [0, B) the chosen sequences, rows
    [B, 2B) the rejected ones; answer_mask is 1 on each row's answer tokens (EOS included)."""
    rows = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    flags = ([[0] * len(p.prompt_ids) + [1] * len(p.chosen_answer_ids) for p in pairs]
             + [[0] * len(p.prompt_ids) + [1] * len(p.rejected_answer_ids) for p in pairs])
    ids, mask = pad_sequences(rows, pad_id, side="right")  # (2B, L) each
    return ids, mask, pad_sequences(flags, 0, side="right")[0]


def finetune_top_layers(model: RewardModel, tokenizer, pairs: Sequence[PairLike], margins: torch.Tensor,
                        weights: torch.Tensor, lr: float, epochs: int, batch_pairs: int = 16, seed: int = 0,
                        max_length: int = 512, n_layers: int = 1,
                        on_epoch: Callable[[int, float, RewardModel], None] | None = None) -> RewardModel:
    """A float32 copy of `model` whose last `n_layers` decoder layers are trained on the votes `pairs` (chosen over
    rejected; margins and weights (N,) as the head had them, rlhf.losses.graded_terms) by Adam at `lr` for `epochs`
    passes in shuffled batches of `batch_pairs`; v_head, the embeddings and every other layer stay as they are.
    `on_epoch(epoch, mean loss, model)` after each pass, the model in eval mode (to be measured, not changed).
    `model` itself is left untouched (it may share its weights with the feature extractor's backbone)."""
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
    optimizer = torch.optim.Adam(trained.parameters(), lr=lr)
    tokenized = tokenize_pairs(tokenizer, pairs, max_length)
    margins, weights = margins.float(), weights.float()
    device = next(tuned.parameters()).device
    generator = torch.Generator().manual_seed(seed)
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
