"""Pure tensor maths for the reward model and PPO, following DeepSpeed-Chat (steps 2 and 3).

Everything here is a function of tensors (or a tiny controller object holding floats); nothing knows
about models, tokenizers or devices. Shapes: B = batch, L = full sequence length, T = response length,
V = vocabulary. Masks may be bool, int or float (1 = real token); masked positions never influence a
result, even when they hold NaN. Losses are computed in at least float32 (DeepSpeed-Chat's
`compute_fp32_loss`), so bf16 inputs are safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _fp32(x: Tensor) -> Tensor:
    """Upcast half-precision tensors to float32; leave float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _last_real_index(mask: Tensor) -> Tensor:
    """Index of the last position where mask == 1 in each row, for any padding side. (B, L) -> (B,)"""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)  # (B, L)
    last = torch.where(mask.bool(), positions, -1).max(dim=-1).values  # (B,)
    if bool((last < 0).any()):
        raise ValueError("a row of the mask has no real token")
    return last


# ---------------------------------------------------------------------------------------------------
# Generic helpers
# ---------------------------------------------------------------------------------------------------


def gather_log_probs(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels]: log p(labels[b, t] | logits[b, t]).  (B, L, V), (B, L) -> (B, L)

    Call it as `gather_log_probs(logits[:, :-1], seq[:, 1:])` so that the log-prob of token t comes
    from the logits at t - 1. Computed as logit[label] - logsumexp(logits) in float32, one row at a
    time for half precision so no (B, L, V) float32 copy is made.
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, L)
        return picked - torch.logsumexp(logits, dim=-1)  # (B, L)
    rows = []
    for row_logits, row_labels in zip(logits, labels):  # (L, V), (L,)
        row_log_probs = F.log_softmax(row_logits.float(), dim=-1)  # (L, V)
        rows.append(row_log_probs.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1))  # (L,)
    return torch.stack(rows)  # (B, L)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position: H = logsumexp(z) - sum_v softmax(z)_v z_v.  (B, L, V) -> (B, L)

    Logits of -inf (tokens a sampling warper removed) have probability 0 and add nothing (not 0 * -inf = NaN).
    """
    logits = _fp32(logits)
    probs = torch.softmax(logits, dim=-1)  # (B, L, V)
    finite = logits.masked_fill(torch.isneginf(logits), 0.0)  # (B, L, V)
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(dim=-1)  # (B, L)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) / sum(mask), over `dim` or over everything; 0 (not NaN) where the mask is empty."""
    keep = mask.bool()
    total = torch.where(keep, x, torch.zeros_like(x)).sum(dim=dim)
    return total / keep.sum(dim=dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries: mean((x - mean)^2), times n / (n - 1) when unbiased (as TRL)."""
    centred = x - masked_mean(x, mask)
    var = masked_mean(centred**2, mask)
    if unbiased:
        n = mask.bool().sum()
        if int(n) < 2:
            raise ValueError(f"unbiased masked variance needs at least 2 real entries, got {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked entries (TRL); keeps the mean when not shift_mean.

    Masked positions come back as 0, so padding cannot carry NaN or large values downstream.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


# ---------------------------------------------------------------------------------------------------
# Reward model (DeepSpeed-Chat step 2)
# ---------------------------------------------------------------------------------------------------


def last_token_scores(values: Tensor, attention_mask: Tensor) -> Tensor:
    """values[b, last b with mask == 1]: the score of each sequence, under left or right padding.  (B, L) -> (B,)"""
    last = _last_real_index(attention_mask)  # (B,)
    return values.gather(-1, last.unsqueeze(-1)).squeeze(-1)  # (B,)


GRADED_USES = ("off", "margin", "weight")
"""How a graded vote (slightly or much better) enters the pairwise loss: not at all, as a margin, or as a weight."""


def graded_terms(strength: Tensor, use: str, much_margin: float = 1.0,
                 much_weight: float = 2.0) -> tuple[Tensor, Tensor]:
    """(margin (N,), weight (N,)) of N votes of strength 1 (slightly better) to 2 (much better).

    A strength between (the mean of several people's votes on a pair) interpolates: with f = clamp(strength - 1, 0, 1),
    use "margin" gives margin = much_margin * f and weight 1 (Llama 2's m(r) in -log sigmoid(r_c - r_r - m(r)): a vote
    for "much better" asks for a larger score gap); "weight" gives margin 0 and weight = 1 + (much_weight - 1) * f;
    "off" gives margin 0 and weight 1, whatever the strength.
    """
    if use not in GRADED_USES:
        raise ValueError(f"graded use must be one of {', '.join(GRADED_USES)}, not {use!r}")
    much = (strength.double() - 1.0).clamp(0.0, 1.0)  # (N,) share of "much better"
    zero, one = torch.zeros_like(much), torch.ones_like(much)
    if use == "margin":
        return much_margin * much, one
    if use == "weight":
        return zero, 1.0 + (much_weight - 1.0) * much
    return zero, one


def bradley_terry_loss(score_diff: Tensor, margin: float | Tensor = 0.0, weight: Tensor | None = None) -> Tensor:
    """Weighted mean of -log sigmoid(score_diff - margin) = softplus(margin - score_diff) over pairs.  (N,) -> ()

    score_diff is r_chosen - r_rejected per pair; weight (N,) defaults to 1 each and is normalised by its sum, so a
    weight of 2 counts a vote twice.
    """
    score_diff = _fp32(score_diff)
    terms = F.softplus(torch.as_tensor(margin, dtype=score_diff.dtype, device=score_diff.device) - score_diff)  # (N,)
    if weight is None:
        return terms.mean()
    weight = weight.to(score_diff.dtype)
    return (weight * terms).sum() / weight.sum()


class PairSide(NamedTuple):
    """One side (the chosen or the rejected answers) of B pairs, as the pairwise loss reads it."""

    values: Tensor
    """(B, L) the reward model's value at every position."""
    ids: Tensor
    """(B, L) token ids (the divergence form compares them with the other side's)."""
    mask: Tensor
    """(B, L) attention mask, 1 on real tokens."""


def divergence_span(chosen: PairSide, rejected: PairSide) -> Tensor:
    """(B, L) bool: the positions d_i <= t < e_i that pairwise_loss's divergence form averages over (see there);
    the single position e_i - 1 for identical sequences. Raises ValueError unless both masks are right-padded."""
    chosen_real, rejected_real = chosen.mask.bool(), rejected.mask.bool()  # (B, L)
    for name, real in (("the chosen mask", chosen_real), ("the rejected mask", rejected_real)):
        # right padding <=> each row is 1...1 0...0 <=> the mask never rises along L
        if bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError(f"{name} is not right-padded; the divergence form needs right padding")
    seq_len = chosen.ids.shape[-1]
    positions = torch.arange(seq_len, device=chosen.ids.device).expand_as(chosen.ids)  # (B, L)
    end = torch.maximum(chosen_real.sum(-1), rejected_real.sum(-1))  # (B,)
    # a position diverges when the tokens differ among real tokens, or only one side is real there
    differs = (chosen_real != rejected_real) | (chosen_real & (chosen.ids != rejected.ids))  # (B, L)
    first_diff = torch.where(differs, positions, seq_len).min(dim=-1).values  # (B,)
    start = torch.where(first_diff >= seq_len, end - 1, first_diff)  # (B,) identical sequences: the last position
    return (positions >= start.unsqueeze(-1)) & (positions < end.unsqueeze(-1))


def pairwise_loss(
    chosen: PairSide,
    rejected: PairSide,
    *,
    form: Literal["divergence", "last_token"] = "divergence",
    margin: float | Tensor = 0.0,
    center_coef: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pairwise reward-model loss -log sigmoid(r_chosen - r_rejected - margin).

    Returns (loss, chosen_scores, rejected_scores).

    Inputs are (B, L) each (values, token ids, attention masks of each side) for B pairs; scores are (B,), the
    value at each sequence's last real token.

    form="divergence" (DeepSpeed-Chat, default): for pair i, with d_i the first position where the two
    sequences differ (in token or in padding) and e_i = max(len_chosen_i, len_rejected_i),
        loss_i = mean_{d_i <= t < e_i} -log sigmoid(c_i[t] - r_i[t] - margin_i)
    and the loss is mean_i loss_i. Positions past the shorter sequence's end use its values there, as
    DeepSpeed-Chat does. Identical sequences use the single position e_i - 1 (DeepSpeed-Chat uses the
    padded length's last position; that is the same position when unpadded, and the last real token
    rather than a pad when padded). This form compares positions one to one, so it REQUIRES RIGHT
    PADDING (both prompts start at position 0); a left-padded mask raises ValueError.

    form="last_token" (TRL): loss = mean_i -log sigmoid(score_c_i - score_r_i - margin_i); works with
    either padding side.

    Centering (Eisenstein et al. 2023, TRL's center_rewards_coefficient) adds
    center_coef * mean_i (score_c_i + score_r_i)^2 in both forms. `margin` is a float or a (B,) tensor.
    """
    chosen_values, rejected_values = _fp32(chosen.values), _fp32(rejected.values)  # (B, L)
    chosen_scores = last_token_scores(chosen_values, chosen.mask)  # (B,)
    rejected_scores = last_token_scores(rejected_values, rejected.mask)  # (B,)
    margin_t = torch.as_tensor(margin, dtype=chosen_values.dtype, device=chosen_values.device)

    if form == "last_token":
        loss = -F.logsigmoid(chosen_scores - rejected_scores - margin_t).mean()
    elif form == "divergence":
        span = divergence_span(chosen, rejected)  # (B, L)
        margin_col = margin_t.unsqueeze(-1) if margin_t.dim() == 1 else margin_t
        per_token = -F.logsigmoid(chosen_values - rejected_values - margin_col)  # (B, L)
        loss = masked_mean(per_token, span, dim=-1).mean()
    else:
        raise ValueError(f"unknown pairwise loss form {form!r}; use 'divergence' or 'last_token'")

    if center_coef:
        loss = loss + center_coef * ((chosen_scores + rejected_scores) ** 2).mean()
    return loss, chosen_scores, rejected_scores


# ---------------------------------------------------------------------------------------------------
# PPO (DeepSpeed-Chat step 3). Response-only layout: (B, T) over the response positions, with
# action_mask 1 on the tokens the actor produced (EOS included) and 0 on the padding after them.
# ---------------------------------------------------------------------------------------------------


def compute_rewards(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    reward_score: Tensor,
    action_mask: Tensor,
    kl_ctl: float,
    clip_reward_value: float,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO rewards and per-token KL; returns (rewards (B, T), kl (B, T)).

        kl[b, t]      = log_probs[b, t] - ref_log_probs[b, t]              (k1 estimate, log pi/pi_ref)
        rewards[b, t] = -kl_ctl * kl[b, t]
        rewards[b, last_b] += clamp(reward_score[b], -clip_reward_value, clip_reward_value)
    where last_b is the last real response token of row b (rows may have different lengths); both are 0
    on masked positions. DeepSpeed-Chat reaches the same last position with `ends = start +
    action_mask.sum(1) + 1`, because its mask drops EOS when pad == eos; this mask includes EOS.
    """
    real = action_mask.bool()  # (B, T)
    kl = torch.where(real, _fp32(log_probs) - _fp32(ref_log_probs), 0.0)  # (B, T)
    rewards = -kl_ctl * kl  # (B, T)
    last = _last_real_index(real)  # (B,)
    clipped = torch.clamp(_fp32(reward_score), -clip_reward_value, clip_reward_value).to(rewards.dtype)  # (B,)
    rewards = rewards.scatter_add(-1, last.unsqueeze(-1), clipped.unsqueeze(-1))  # (B, T)
    return rewards, kl


def gae_advantages_and_returns(
    values: Tensor, rewards: Tensor, action_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation from the end; returns (advantages, returns), both (B, T), detached.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}       (A_{T} = 0, V_{T} = 0)
        returns = A + V
    Values and rewards are zeroed on masked positions first (DeepSpeed-Chat zeroes both after `ends`), so
    after a row's last real token V = 0 and A = 0: the episode ends there and padding cannot leak
    into earlier positions. Masked positions get A = 0 and returns = 0. The mask must be one contiguous
    block per row (response-only layout; a masked prompt before it is fine too).
    """
    real = action_mask.bool()  # (B, T)
    values = torch.where(real, _fp32(values).detach(), 0.0)  # (B, T)
    rewards = torch.where(real, _fp32(rewards).detach(), 0.0)  # (B, T)
    length = rewards.shape[-1]
    last_gae = torch.zeros_like(rewards[:, 0])  # (B,)
    advantages_reversed = []
    for t in reversed(range(length)):
        next_values = values[:, t + 1] if t < length - 1 else torch.zeros_like(last_gae)  # (B,)
        delta = rewards[:, t] + gamma * next_values - values[:, t]  # (B,)
        last_gae = delta + gamma * lam * last_gae  # (B,)
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # (B, T)
    advantages = torch.where(real, advantages, 0.0)  # (B, T): a masked prompt before the block gets 0
    returns = advantages + values  # (B, T)
    return advantages, returns


def actor_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cliprange: float
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped policy loss; returns (loss, clipfrac, approx_kl), all scalars (the last two detached).

        ratio  = exp((logp - old_logp) * mask)
        loss   = masked_mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))
        clipfrac  = share of masked tokens where the clipped term is the larger (strictly)
        approx_kl = masked_mean(0.5 * (logp - old_logp)^2)   (the k2 estimator of KL(old || new), Schulman 2020)
    """
    real = mask.bool()  # (B, T)
    log_ratio = torch.where(real, _fp32(log_probs) - _fp32(old_log_probs), 0.0)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    advantages = torch.where(real, _fp32(advantages), 0.0)  # (B, T)
    pg_loss1 = -advantages * ratio  # (B, T)
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)  # (B, T)
    loss = masked_mean(torch.max(pg_loss1, pg_loss2), real)
    with torch.no_grad():
        clipfrac = masked_mean((pg_loss2 > pg_loss1).to(ratio.dtype), real)
        approx_kl = masked_mean(0.5 * log_ratio**2, real)
    return loss, clipfrac, approx_kl


def critic_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, cliprange_value: float
) -> tuple[Tensor, Tensor]:
    """PPO clipped value loss; returns (loss, vf_clipfrac), scalars (the second detached).

        V_clip = clip(V, V_old - c, V_old + c)
        loss   = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))
        vf_clipfrac = share of masked tokens where the clipped term is the larger (strictly)
    """
    real = mask.bool()  # (B, T)
    values = torch.where(real, _fp32(values), 0.0)  # (B, T)
    old_values = torch.where(real, _fp32(old_values), 0.0)  # (B, T)
    returns = torch.where(real, _fp32(returns), 0.0)  # (B, T)
    values_clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)  # (B, T)
    vf_loss1 = (values - returns) ** 2  # (B, T)
    vf_loss2 = (values_clipped - returns) ** 2  # (B, T)
    loss = 0.5 * masked_mean(torch.max(vf_loss1, vf_loss2), real)
    with torch.no_grad():
        vf_clipfrac = masked_mean((vf_loss2 > vf_loss1).to(values.dtype), real)
    return loss, vf_clipfrac


def truncation_penalty(reward_score: Tensor, ended: Tensor, penalty: float) -> Tensor:
    """reward_score - penalty where the answer hit the length limit without EOS (ended False).  (B,) -> (B,)"""
    return torch.where(ended.bool(), reward_score, reward_score - penalty)


# ---------------------------------------------------------------------------------------------------
# KL coefficient controllers and reward normalisation
# ---------------------------------------------------------------------------------------------------


class FixedKLController:
    """Constant KL coefficient (DeepSpeed-Chat's kl_ctl); same interface as AdaptiveKLController."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, as TRL), steering the observed KL toward `target`.

        e = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + e * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError("adaptive KL needs target > 0 and horizon > 0")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient after `n_steps` samples whose mean KL was `current_kl`."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def normalize_rewards(scores: Tensor, mean: float | Tensor, std: float | Tensor, eps: float = 1e-8) -> Tensor:
    """(scores - mean) / (std + eps).  (B,) -> (B,)"""
    return (scores - mean) / (std + eps)


@dataclass
class RunningMoments:
    """Running mean and standard deviation of reward scores over all batches seen (TRL's RunningMoments)."""

    mean: float = 0.0
    """Mean of every score seen so far."""
    var: float = 1.0
    """Population variance of every score seen so far (1 before the first update)."""
    std: float = 1.0
    """Sample standard deviation (n - 1) of every score seen so far (1 before the first update)."""
    count: int = 0
    """Number of scores seen so far."""

    def update(self, xs: Tensor) -> tuple[float, float]:
        """Merge a batch (Chan et al. parallel variance); returns the batch's (mean, sample std)."""
        n = xs.numel()
        if n < 2:
            raise ValueError("RunningMoments.update needs at least 2 scores per batch")
        xs_var, xs_mean = torch.var_mean(xs.detach().double(), unbiased=False)
        delta = float(xs_mean) - self.mean
        total = self.count + n
        # sum of squared deviations: old (shifted to the new mean) plus new
        m2 = self.var * self.count + delta**2 * self.count * n / total + float(xs_var) * n
        self.mean += delta * n / total
        self.var = m2 / total
        self.std = (m2 / (total - 1)) ** 0.5
        self.count = total
        return float(xs_mean), (float(xs_var) * n / (n - 1)) ** 0.5

    def normalize(self, scores: Tensor, eps: float = 1e-8) -> Tensor:
        """(scores - running mean) / (running std + eps).  (B,) -> (B,)"""
        return normalize_rewards(scores, self.mean, self.std, eps)
