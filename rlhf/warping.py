"""The distribution PPO samples from, as log-probs: transformers' sampling processors as pure tensor functions.

rlhf.decode turns the logits of a step into the sampling distribution as transformers' `generate()` would with the
same settings and every other processor off (`_get_logits_processor`'s order): EOS to -inf while fewer than
min_new_tokens tokens are written (MinNewTokensLengthLogitsProcessor), the repetition penalty on the answer's tokens,
then / temperature, then top-k, then top-p (the warpers, in that order, each on the output of the one before).
`warp_logits` does the same to the training pass's logits, so log-probs, ratios and the KL estimate are those of what
was actually sampled.

The sampled token itself is never removed: the training pass's logits differ from the cached decoding's in the
last bits (more so under bf16), which can move a token across the top-k or top-p boundary; removing it would give
-inf log-probs and NaN losses. Where the two passes agree (always, up to rounding) this changes nothing.
"""

from __future__ import annotations

import torch

from rlhf.sampling import Sampling

Tensor = torch.Tensor


def min_new_tokens_removed(logits: Tensor, eos_ids: tuple[int, ...] | list[int], min_new_tokens: int) -> Tensor:
    """Where EOS may not be sampled yet: EOS ids at response positions t < min_new_tokens.  (B, T, V) -> (B, T, V)"""
    removed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)  # (B, T, V)
    if min_new_tokens > 0 and len(eos_ids) > 0:
        early = torch.arange(logits.shape[-2], device=logits.device) < min_new_tokens  # (T,)
        is_eos = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)  # (V,)
        is_eos[list(eos_ids)] = True
        removed |= early[:, None] & is_eos[None, :]  # (T, V) broadcast over B
    return removed


def top_k_removed(logits: Tensor, top_k: int) -> Tensor:
    """Tokens below the k-th largest logit (ties with it kept), as TopKLogitsWarper.  (..., V) -> (..., V)"""
    k = min(max(top_k, 1), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits < kth  # (..., V)


def nucleus_kept(sorted_logits: Tensor, normaliser: Tensor, top_p: float) -> Tensor:
    """Which of the logits, sorted descending, are in the top-p nucleus. transformers' TopPLogitsWarper removes a token
    when the probability of it and every less likely token is at most 1 - top_p, that is when the probability of the
    tokens ranked above it is at least top_p; read from the top, that needs only the first tokens (`candidate_logits`).
    The most likely token always stays. `normaliser` (..., 1) is the logsumexp of all the row's logits.
    (..., K) -> (..., K) bool
    """
    probs = (sorted_logits - normaliser).exp()  # (..., K)
    above = torch.cat([torch.zeros_like(probs[..., :1]), probs.cumsum(dim=-1)[..., :-1]], dim=-1)  # (..., K)
    kept = above < top_p
    kept[..., 0] = True
    return kept


def top_p_removed(logits: Tensor, top_p: float) -> Tensor:
    """Tokens outside the nucleus, as TopPLogitsWarper (`nucleus_kept` on the whole sorted row).
    (..., V) -> (..., V)"""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V) each
    kept = nucleus_kept(sorted_logits, logits.logsumexp(dim=-1, keepdim=True), top_p)  # (..., V) sorted order
    return (~kept).scatter(-1, order, ~kept)  # (..., V) back in vocabulary order


FIRST_CANDIDATES = 64
"""Tokens `candidate_logits` looks at first for a nucleus (widened 4x at a time until the nucleus is inside)."""


def candidate_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> tuple[Tensor, Tensor]:
    """The tokens top-k then top-p may sample, without sorting the vocabulary: (B, V) tempered logits ->
    (values, ids), each (B, K), values descending with -inf where removed, ids their vocabulary ids.

    The same tokens as `top_k_removed` then `top_p_removed` keep (up to ties at the k-th logit): the nucleus is read
    from the top among the first K tokens, K widened until every row's K-th token is outside it. At temperature 0.7
    the default model's nucleus of 0.95 is rarely over 64 tokens, and `torch.topk` of 64 costs 1.3 ms where sorting
    16 x 49,152 logits costs 62 ms (one core).
    """
    n_vocab = logits.shape[-1]
    if top_k <= 0 and top_p >= 1.0:
        return logits, torch.arange(n_vocab, device=logits.device).expand_as(logits)
    k = min(top_k, n_vocab) if top_k > 0 else min(FIRST_CANDIDATES, n_vocab)
    # without top-k the nucleus is a share of the whole row's mass; with it, of the k kept tokens' mass
    normaliser = None if top_k > 0 else logits.logsumexp(dim=-1, keepdim=True)  # (B, 1)
    while True:
        values, ids = torch.topk(logits, k, dim=-1)  # (B, K) each, descending
        if top_p >= 1.0:
            return values, ids
        kept = nucleus_kept(values, values.logsumexp(dim=-1, keepdim=True) if normaliser is None else normaliser,
                            top_p)  # (B, K)
        if top_k > 0 or k == n_vocab or not bool(kept[:, -1].any()):
            return values.masked_fill(~kept, float("-inf")), ids
        k = min(4 * k, n_vocab)


def seen_before(tokens: Tensor, n_vocab: int) -> Tensor:
    """Which tokens each response position has already written: seen[b, t, v] is True when tokens[b, s] == v for some
    s < t (what the repetition penalty at position t counts).  (B, T) -> (B, T, V) bool"""
    n_rows, width = tokens.shape
    positions = torch.arange(width, device=tokens.device)  # (T,)
    first = torch.full((n_rows, n_vocab), width, dtype=torch.long, device=tokens.device)  # (B, V): never written
    first.scatter_reduce_(1, tokens, positions.expand(n_rows, width), reduce="amin")  # first position of each token
    return first[:, None, :] < positions[None, :, None]  # (B, T, V)


def repetition_penalised(logits: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty as transformers applies it, on logits of tokens already written: a positive logit
    divided by `penalty`, a negative one multiplied; differentiable.  (...) -> (...)"""
    return torch.where(logits < 0, logits * penalty, logits / penalty)


def penalise_seen(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """`repetition_penalised` where `seen` (once per token, however often it occurred).  (..., V), (..., V) bool ->
    (..., V)"""
    return torch.where(seen, repetition_penalised(logits, penalty), logits)


def warp_logits(logits: Tensor, tokens: Tensor, sampling: Sampling,
                eos_ids: tuple[int, ...] | list[int] = ()) -> Tensor:
    """The logits generate() sampled `tokens` from under `sampling`: (B, T, V) response-position logits, (B, T) tokens
    -> (B, T, V) fp32.

    Position t of the response layout is the t-th generated token (rlhf.ppo.experience); the repetition penalty at t
    counts the tokens before t. Removed tokens get -inf; gradients flow through the kept ones. top_k 0 and top_p 1.0
    are off, as in transformers. `eos_ids` are the ids min_new_tokens holds back.
    """
    raw = logits.float()  # (B, T, V), in fp32 as generate() warps
    if sampling.repetition_penalty != 1.0:
        raw = penalise_seen(raw, seen_before(tokens, raw.shape[-1]), sampling.repetition_penalty)  # (B, T, V)
    tempered = raw / sampling.temperature  # (B, T, V)
    if sampling.top_k <= 0 and sampling.top_p >= 1.0 and sampling.min_new_tokens <= 0:
        return tempered
    with torch.no_grad():
        removed = min_new_tokens_removed(tempered, eos_ids, sampling.min_new_tokens)  # (B, T, V)
        work = tempered.detach().masked_fill(removed, float("-inf"))  # (B, T, V) what the next warper sees
        if sampling.top_k > 0:
            removed |= top_k_removed(work, sampling.top_k)
            work = work.masked_fill(removed, float("-inf"))
        if sampling.top_p < 1.0:
            # one row at a time: the sort's indices are int64, 2x the fp32 logits of the whole batch
            removed |= torch.stack([top_p_removed(row, sampling.top_p) for row in work])  # (B, T, V)
        removed.scatter_(-1, tokens.unsqueeze(-1), False)  # the sampled token stays (see the module's note)
    return tempered.masked_fill(removed, float("-inf"))  # (B, T, V)
