"""rlhf.losses on small numbers worked out by hand (each test writes its hand computation down)."""

import math

import pytest
import torch

from rlhf.losses import (
    AdaptiveKLController,
    FixedKLController,
    PairSide,
    RunningMoments,
    actor_loss,
    bradley_terry_loss,
    compute_rewards,
    critic_loss,
    entropy_from_logits,
    gae_advantages_and_returns,
    gather_log_probs,
    graded_terms,
    last_token_scores,
    masked_mean,
    masked_var,
    masked_whiten,
    normalize_rewards,
    pairwise_loss,
    truncation_penalty,
)

NAN = float("nan")


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).double(), torch.as_tensor(expected).double(), atol=tol, rtol=0)


# --------------------------------------------------------------------------------------- log-probs


def test_gather_log_probs_of_hand_made_distributions():
    # position 0: logits log(1, 2, 3) -> softmax (1/6, 2/6, 3/6); label 2 -> log(1/2), label 0 -> log(1/6)
    # position 1: logits (0, 0, 0) -> uniform 1/3; label 1 -> log(1/3)
    logits = torch.tensor([[[0.0, math.log(2), math.log(3)], [0.0, 0.0, 0.0]]])  # (1, 2, 3)
    close(gather_log_probs(logits, torch.tensor([[2, 1]])), [[math.log(0.5), math.log(1 / 3)]])
    close(gather_log_probs(logits, torch.tensor([[0, 1]])), [[math.log(1 / 6), math.log(1 / 3)]])
    # bf16 logits take the row-by-row float32 path and give the same numbers (to bf16 rounding of the logits)
    close(gather_log_probs(logits.bfloat16(), torch.tensor([[2, 1]])), [[math.log(0.5), math.log(1 / 3)]], tol=1e-2)


def test_log_prob_of_token_t_comes_from_logits_at_t_minus_1():
    # seq = (3, 1, 2); the logits at position 0 put 10 on token 1 (= seq[1]), at position 1 put 10 on
    # token 2 (= seq[2]), the last position's logits are unused. Vocab 4, so each aligned log-prob is
    # log(e^10 / (e^10 + 3)) = -log(1 + 3 e^-10) = -0.00013619; misaligned it would be about -10.
    seq = torch.tensor([[3, 1, 2]])  # (1, 3)
    logits = torch.zeros(1, 3, 4)  # (1, 3, 4)
    logits[0, 0, 1] = 10.0
    logits[0, 1, 2] = 10.0
    logits[0, 2] = torch.tensor([50.0, -50.0, 7.0, 3.0])
    log_probs = gather_log_probs(logits[:, :-1], seq[:, 1:])  # (1, 2)
    close(log_probs, [[-0.00013619, -0.00013619]], tol=1e-6)


def test_entropy_from_logits():
    # uniform over 4 -> log 4 = 1.386294; probs (1/6, 1/3, 1/2) ->
    # (1/6) ln 6 + (1/3) ln 3 + (1/2) ln 2 = 0.298627 + 0.366204 + 0.346574 = 1.011404
    logits = torch.tensor([[[1.0, 1.0, 1.0, 1.0], [0.0, math.log(2), math.log(3), -float("inf")]]])  # (1, 2, 4)
    close(entropy_from_logits(logits[..., :3]), [[math.log(3), 1.011404]])
    close(entropy_from_logits(logits[:, :1]), [[1.386294]])
    # a token a sampling warper removed (-inf) has probability 0 and adds nothing: the same 1.011404, not NaN
    close(entropy_from_logits(logits[:, 1:]), [[1.011404]])


# --------------------------------------------------------------------------------------- whitening


def test_masked_mean_var_whiten_over_real_entries_only():
    # real entries 1, 2, 3, 4, 5: mean 3, squared deviations 4+1+0+1+4 = 10,
    # biased var 10/5 = 2, unbiased 10/4 = 2.5; whitened = (x - 3) / sqrt(2.5) = (x - 3) * 0.632456
    x = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 5.0, 1e6, NAN]])  # (2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # (2, 4)
    close(masked_mean(x, mask), 3.0)
    close(masked_mean(x, mask, dim=1), [2.0, 4.5])
    close(masked_var(x, mask), 2.5)
    close(masked_var(x, mask, unbiased=False), 2.0)
    white = masked_whiten(x, mask)
    s = 0.6324555
    close(white, [[-2 * s, -s, 0.0, 0.0], [s, 2 * s, 0.0, 0.0]])
    close(masked_mean(white, mask), 0.0)
    close(masked_var(white, mask), 1.0)
    close(masked_mean(masked_whiten(x, mask, shift_mean=False), mask), 3.0)


def test_masked_mean_of_empty_mask_is_zero_and_var_needs_two_entries():
    assert masked_mean(torch.tensor([NAN, 2.0]), torch.tensor([0, 0])).item() == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(torch.tensor([1.0, 2.0]), torch.tensor([1, 0]))


# --------------------------------------------------------------------------------------- reward model


def test_last_token_scores_under_right_and_left_padding():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])  # (2, 4)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])  # lengths 2, 3 -> positions 1, 2
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])  # last real token always at position 3
    close(last_token_scores(values, right), [2.0, 7.0])
    close(last_token_scores(values, left), [4.0, 8.0])
    with pytest.raises(ValueError, match="no real token"):
        last_token_scores(values, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))


def two_pairs():
    """Two right-padded pairs with different divergence indices and lengths (L = 5, pad id 0)."""
    # pair 0: chosen 1 2 3 4 (len 4), rejected 1 2 5 (len 3): diverge at 2, end max(4, 3) = 4 -> span 2, 3
    # pair 1: chosen 1 7 8 (len 3), rejected 1 7 8 9 6 (len 5): diverge at 3 (pad vs 9), end 5 -> span 3, 4
    chosen_ids = torch.tensor([[1, 2, 3, 4, 0], [1, 7, 8, 0, 0]])
    rejected_ids = torch.tensor([[1, 2, 5, 0, 0], [1, 7, 8, 9, 6]])
    chosen_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    rejected_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    # c - r: pair 0 = (9, 9, 0, 1, 100), pair 1 = (3, 3, -0.1, -1, 2); only the spans count
    chosen_values = torch.tensor([[9.0, 9.0, 0.5, 1.5, 50.0], [3.0, 3.0, 0.2, 1.0, 2.0]], requires_grad=True)
    rejected_values = torch.tensor([[0.0, 0.0, 0.5, 0.5, -50.0], [0.0, 0.0, 0.3, 2.0, 0.0]], requires_grad=True)
    return PairSide(chosen_values, chosen_ids, chosen_mask), PairSide(rejected_values, rejected_ids, rejected_mask)


def test_pairwise_divergence_form_by_hand():
    # -log sigmoid(x) = ln(1 + e^-x)
    # pair 0: span (2, 3), c - r = (0, 1): (ln 2 + ln(1 + e^-1)) / 2 = (0.693147 + 0.313262) / 2 = 0.503204
    # pair 1: span (3, 4), c - r = (-1, 2): (ln(1 + e) + ln(1 + e^-2)) / 2 = (1.313262 + 0.126928) / 2 = 0.720095
    # loss = (0.503204 + 0.720095) / 2 = 0.611650
    # scores at the last real token: chosen (pos 3, pos 2) = (1.5, 0.2), rejected (pos 2, pos 4) = (0.5, 0.0)
    pairs = two_pairs()
    loss, chosen_scores, rejected_scores = pairwise_loss(*pairs)
    close(loss, 0.611650)
    close(chosen_scores, [1.5, 0.2])
    close(rejected_scores, [0.5, 0.0])
    # only span positions get gradient: d loss / d c[t] = -sigmoid(-(c - r)) / (2 pairs * 2 positions)
    loss.backward()
    grad = pairs[0].values.grad
    assert torch.all(grad[0, [0, 1, 4]] == 0) and torch.all(grad[1, [0, 1, 2]] == 0)
    close(grad[0, 2], -0.5 / 4)  # sigmoid(0) = 0.5


def test_pairwise_divergence_form_ignores_values_outside_the_spans():
    chosen, rejected = two_pairs()
    garbage_c, garbage_r = chosen.values.detach().clone(), rejected.values.detach().clone()
    garbage_c[0, :2], garbage_r[0, 4], garbage_c[1, :3] = -1e4, 1e4, 1e4
    loss, _, _ = pairwise_loss(chosen._replace(values=garbage_c), rejected._replace(values=garbage_r))
    close(loss, 0.611650)


def test_pairwise_divergence_form_with_margin_and_per_pair_margin():
    # margin 1 shifts every c - r by -1: pair 0 (-1, 0) -> (1.313262 + 0.693147) / 2 = 1.003204,
    # pair 1 (-2, 1) -> (2.126928 + 0.313262) / 2 = 1.220095; loss = 1.111650.
    # per-pair margin (1, 0): (1.003204 + 0.720095) / 2 = 0.861650
    pairs = two_pairs()
    close(pairwise_loss(*pairs, margin=1.0)[0], 1.111650)
    close(pairwise_loss(*pairs, margin=torch.tensor([1.0, 0.0]))[0], 0.861650)


def test_pairwise_identical_sequences_use_their_last_real_token():
    # same ids and mask (len 3 of 5): span is the single position 2; c - r = 0.7 - 0.2 = 0.5
    # loss = ln(1 + e^-0.5) = 0.474077
    ids = torch.tensor([[1, 2, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    chosen_values = torch.tensor([[5.0, 5.0, 0.7, 9.0, 9.0]])
    rejected_values = torch.tensor([[0.0, 0.0, 0.2, 0.0, 0.0]])
    loss, chosen_scores, rejected_scores = pairwise_loss(PairSide(chosen_values, ids, mask),
                                                         PairSide(rejected_values, ids, mask))
    close(loss, 0.474077)
    close(chosen_scores, [0.7])
    close(rejected_scores, [0.2])


def test_pairwise_divergence_counts_a_pad_against_a_real_token_with_the_same_id():
    # pad id 0 is also a real token here (pad == eos): chosen 1 2 3 (len 3), rejected 1 2 3 0 5 (len 5).
    # Position 3 holds id 0 on both sides, but it is pad vs real: divergence 3, end 5, span (3, 4),
    # c - r = (-1, 1): (ln(1 + e) + ln(1 + e^-1)) / 2 = (1.313262 + 0.313262) / 2 = 0.813262
    # (comparing ids alone would start at 4: ln(1 + e^-1) = 0.313262)
    chosen_ids, rejected_ids = torch.tensor([[1, 2, 3, 0, 0]]), torch.tensor([[1, 2, 3, 0, 5]])
    chosen_values = torch.tensor([[0.0, 0.0, 0.0, 1.0, 2.0]])
    rejected_values = torch.tensor([[0.0, 0.0, 0.0, 2.0, 1.0]])
    chosen_mask, rejected_mask = torch.tensor([[1, 1, 1, 0, 0]]), torch.tensor([[1, 1, 1, 1, 1]])
    loss, _, _ = pairwise_loss(PairSide(chosen_values, chosen_ids, chosen_mask),
                               PairSide(rejected_values, rejected_ids, rejected_mask))
    close(loss, 0.813262)


def test_pairwise_divergence_form_refuses_left_padding():
    chosen, rejected = two_pairs()
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        pairwise_loss(chosen, rejected._replace(mask=left))


def test_pairwise_last_token_form_margin_and_centering():
    # scores c = (1.5, 0.2), r = (0.5, 0.0): c - r = (1, 0.2)
    # loss = (ln(1 + e^-1) + ln(1 + e^-0.2)) / 2 = (0.313262 + 0.598139) / 2 = 0.455700
    # margin 0.5: c - r - m = (0.5, -0.3): (0.474077 + 0.854355) / 2 = 0.664216
    # centering 0.01 * mean((1.5 + 0.5)^2, (0.2 + 0)^2) = 0.01 * (4 + 0.04) / 2 = 0.0202
    pairs = two_pairs()
    close(pairwise_loss(*pairs, form="last_token")[0], 0.455700)
    close(pairwise_loss(*pairs, form="last_token", margin=0.5)[0], 0.664216)
    close(pairwise_loss(*pairs, form="last_token", center_coef=0.01)[0], 0.455700 + 0.0202)
    close(pairwise_loss(*pairs, center_coef=0.01)[0], 0.611650 + 0.0202)
    with pytest.raises(ValueError, match="unknown"):
        pairwise_loss(*pairs, form="mean")


def test_pairwise_last_token_form_works_with_left_padding():
    # the same sequences left-padded: chosen score at position 4 for both rows, rejected too
    # c - r = (1 - 0, 2 - 1) = (1, 1): loss = ln(1 + e^-1) = 0.313262
    values_c = torch.tensor([[9.0, 9.0, 0.0, 0.0, 1.0], [9.0, 0.0, 0.0, 0.0, 2.0]])
    values_r = torch.tensor([[-9.0, 0.0, 0.0, 0.0, 0.0], [-9.0, -9.0, 0.0, 0.0, 1.0]])
    mask_c = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    mask_r = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    ids = torch.zeros(2, 5, dtype=torch.long)
    loss, chosen_scores, _ = pairwise_loss(PairSide(values_c, ids, mask_c), PairSide(values_r, ids, mask_r),
                                           form="last_token")
    close(loss, 0.313262)
    close(chosen_scores, [1.0, 2.0])


# --------------------------------------------------------------------------------------- PPO rewards


def test_rewards_kl_plus_clipped_score_at_last_response_token():
    # B = 2, T = 3, row 1 is one token shorter (its last position is padding holding NaN).
    # kl = logp - ref: row 0 (-1 + 1.5, -2 + 1, -0.5 + 0.5) = (0.5, -1, 0); row 1 (-0.3 + 0.2, -1.2 + 1) = (-0.1, -0.2)
    # rewards = -0.1 * kl: row 0 (-0.05, 0.1, 0), row 1 (0.01, 0.02)
    # scores (7, -1) clipped to +-5 -> (5, -1), added at positions 2 and 1:
    # row 0 (-0.05, 0.1, 5.0), row 1 (0.01, 0.02 - 1 = -0.98, 0 on padding)
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, NAN]])
    ref_log_probs = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, kl = compute_rewards(log_probs, ref_log_probs, torch.tensor([7.0, -1.0]), mask, 0.1, 5.0)
    close(rewards, [[-0.05, 0.1, 5.0], [0.01, -0.98, 0.0]])
    close(kl, [[0.5, -1.0, 0.0], [-0.1, -0.2, 0.0]])
    # a score below -clip: -8 -> -5 on row 1: 0.02 - 5 = -4.98
    rewards, _ = compute_rewards(log_probs, ref_log_probs, torch.tensor([1.0, -8.0]), mask, 0.1, 5.0)
    close(rewards, [[-0.05, 0.1, 1.0], [0.01, -4.98, 0.0]])


def test_truncation_penalty_only_hits_answers_that_never_ended():
    close(truncation_penalty(torch.tensor([1.0, 2.0]), torch.tensor([True, False]), 0.5), [1.0, 1.5])


# --------------------------------------------------------------------------------------- GAE


def gae_by_explicit_sums(values, rewards, lengths, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k} over the row's real tokens, with V = 0 past its end."""
    advantages = torch.zeros_like(values)
    for b, n in enumerate(lengths):
        v = torch.cat([values[b, :n], values.new_zeros(1)])  # V_n = 0: the episode ends
        deltas = [rewards[b, t] + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(n):
            advantages[b, t] = sum((gamma * lam) ** k * deltas[t + k] for k in range(n - t))
    return advantages


def test_gae_by_hand_two_rows_of_different_lengths():
    # gamma = 1, lam = 0.95.
    # row 0, V = (0.5, 0.4, 0.8), r = (0.1, -0.2, 1.0):
    #   t2: delta = 1.0 + 0 - 0.8 = 0.2, A = 0.2
    #   t1: delta = -0.2 + 0.8 - 0.4 = 0.2, A = 0.2 + 0.95 * 0.2 = 0.39
    #   t0: delta = 0.1 + 0.4 - 0.5 = 0.0, A = 0.95 * 0.39 = 0.3705;  returns = A + V = (0.8705, 0.79, 1.0)
    # row 1 (2 tokens, garbage 99 in the padding), V = (1.0, 0.5), r = (0.0, 2.0):
    #   t1: delta = 2.0 + 0 - 0.5 = 1.5, A = 1.5
    #   t0: delta = 0.0 + 0.5 - 1.0 = -0.5, A = -0.5 + 0.95 * 1.5 = 0.925;  returns = (1.925, 2.0, 0)
    values = torch.tensor([[0.5, 0.4, 0.8], [1.0, 0.5, 99.0]], requires_grad=True)
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.0, 2.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma=1.0, lam=0.95)
    close(advantages, [[0.3705, 0.39, 0.2], [0.925, 1.5, 0.0]])
    close(returns, [[0.8705, 0.79, 1.0], [1.925, 2.0, 0.0]])
    assert not advantages.requires_grad and not returns.requires_grad


def test_gae_matches_explicit_sum_over_future_deltas():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    rewards = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    lengths = [6, 1, 4, 3]
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5)]:
        advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma, lam)
        expected = gae_by_explicit_sums(values, rewards, lengths, gamma, lam)
        close(advantages, expected, tol=1e-12)
        close(returns, (expected + values) * mask, tol=1e-12)


def test_gae_padding_beyond_the_end_does_not_change_earlier_advantages():
    values = torch.tensor([[1.0, 0.5, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0]])
    clean, _ = gae_advantages_and_returns(values, rewards, mask, 1.0, 0.95)
    dirty, _ = gae_advantages_and_returns(
        torch.tensor([[1.0, 0.5, 1e3, NAN]]), torch.tensor([[0.0, 2.0, -1e3, NAN]]), mask, 1.0, 0.95
    )
    close(dirty, clean)
    close(clean, [[0.925, 1.5, 0.0, 0.0]])
    # a masked prompt in front (full-sequence layout) leaves the response's advantages as they were
    prompt_values, prompt_rewards = torch.tensor([[7.0, 7.0, 1.0, 0.5]]), torch.tensor([[3.0, 3.0, 0.0, 2.0]])
    prefixed, _ = gae_advantages_and_returns(prompt_values, prompt_rewards, torch.tensor([[0, 0, 1, 1]]), 1.0, 0.95)
    close(prefixed, [[0.0, 0.0, 0.925, 1.5]])


# --------------------------------------------------------------------------------------- actor loss


def actor_case():
    # eps = 0.2. row 0: three tokens, row 1: one token then padding (garbage there).
    #   t0: A = 1,  ratio 1.5 > 1.2: max(-1.5, -1.2) = -1.2  (clipped term chosen)
    #   t1: A = -1, ratio 0.5 < 0.8: max(0.5, 0.8)  = 0.8   (clipped term chosen)
    #   t2: A = 2,  ratio 1.0:       max(-2, -2)    = -2.0
    #   t3: A = 1,  ratio 0.5 < 0.8: max(-0.5, -0.8) = -0.5 (unclipped: the pessimistic side)
    old = torch.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    log_probs = old + torch.tensor([[math.log(1.5), math.log(0.5), 0.0], [math.log(0.5), 0.0, 0.0]])
    advantages = torch.tensor([[1.0, -1.0, 2.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return log_probs, old, advantages, mask


def test_actor_loss_both_sides_of_the_clip():
    # loss = (-1.2 + 0.8 - 2.0 - 0.5) / 4 = -0.725; clipfrac = 2 / 4 = 0.5
    # approx_kl = 0.5 * mean(ln(1.5)^2, ln(0.5)^2, 0, ln(0.5)^2) = 0.5 * (0.164402 + 2 * 0.480453) / 4 = 0.140663
    log_probs, old, advantages, mask = actor_case()
    log_probs.requires_grad_(True)
    loss, clipfrac, approx_kl = actor_loss(log_probs, old, advantages, mask, cliprange=0.2)
    close(loss, -0.725)
    close(clipfrac, 0.5)
    close(approx_kl, 0.140663)
    # clipped tokens get no gradient; d/dlogp of -A * ratio / 4 is -A * ratio / 4: t2 -> -0.5, t3 -> -0.125
    loss.backward()
    close(log_probs.grad, [[0.0, 0.0, -0.5], [-0.125, 0.0, 0.0]])


def test_actor_loss_ignores_masked_positions():
    log_probs, old, advantages, mask = actor_case()
    log_probs[1, 1:], old[1, 1:], advantages[1, 1:] = NAN, -1e4, 1e4
    loss, clipfrac, approx_kl = actor_loss(log_probs, old, advantages, mask, cliprange=0.2)
    close(loss, -0.725)
    close(clipfrac, 0.5)
    close(approx_kl, 0.140663)


# --------------------------------------------------------------------------------------- critic loss


def critic_case():
    # c = 0.2.
    #   t0: V 1.0, V_old 0.5, R 2.0: V_clip 0.7; (1.0, 1.69) -> 1.69  (clipped term larger)
    #   t1: V 0.6, V_old 0.5, R 0.0: V_clip 0.6; (0.36, 0.36) -> 0.36
    #   t2: V 1.0, V_old 0.5, R 0.0: V_clip 0.7; (1.0, 0.49) -> 1.0  (clipped but unclipped term larger)
    #   t3: V -1.0, V_old 0.0, R 1.0: V_clip -0.2; (4.0, 1.44) -> 4.0
    values = torch.tensor([[1.0, 0.6, 1.0], [-1.0, 0.0, 0.0]])
    old_values = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return values, old_values, returns, mask


def test_critic_loss_clipped_and_unclipped():
    # loss = 0.5 * (1.69 + 0.36 + 1.0 + 4.0) / 4 = 0.5 * 7.05 / 4 = 0.88125; vf_clipfrac = 1 / 4
    loss, vf_clipfrac = critic_loss(*critic_case(), cliprange_value=0.2)
    close(loss, 0.88125)
    close(vf_clipfrac, 0.25)
    # without a clip range the loss is the plain 0.5 * MSE: 0.5 * (1.0 + 0.36 + 1.0 + 4.0) / 4 = 0.795
    close(critic_loss(*critic_case(), cliprange_value=1e9)[0], 0.795)


def test_critic_loss_ignores_masked_positions():
    values, old_values, returns, mask = critic_case()
    values[1, 1:], old_values[1, 1:], returns[1, 1:] = NAN, 1e4, -1e4
    loss, vf_clipfrac = critic_loss(values, old_values, returns, mask, cliprange_value=0.2)
    close(loss, 0.88125)
    close(vf_clipfrac, 0.25)


# --------------------------------------------------------------------------------------- controllers


def test_adaptive_kl_controller_by_hand():
    # target 6, horizon 10000, value 0.2
    # KL 9: error 9/6 - 1 = 0.5 -> clipped 0.2; mult 1 + 0.2 * 256 / 10000 = 1.00512; value 0.201024
    # KL 3: error -0.5 -> -0.2; mult 0.99488; value 0.201024 * 0.99488 = 0.199994757
    # KL 6.6: error 0.1 (inside the clip); n 1000: mult 1.01; value 0.201994705
    controller = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    controller.update(9.0, n_steps=256)
    assert controller.value == pytest.approx(0.201024, abs=1e-12)
    controller.update(torch.tensor(3.0), n_steps=256)
    assert controller.value == pytest.approx(0.19999475712, abs=1e-12)
    controller.update(6.6, n_steps=1000)
    assert controller.value == pytest.approx(0.19999475712 * 1.01, abs=1e-12)


def test_fixed_kl_controller_never_moves():
    controller = FixedKLController(0.1)
    controller.update(100.0, n_steps=1000)
    assert controller.value == 0.1


def test_running_moments_and_reward_normalisation():
    # batch 1 (1, 2, 3): mean 2, population var 2/3, sample std 1
    # batch 2 (5, 7): all five: mean 18/5 = 3.6, squared deviations 6.76 + 2.56 + 0.36 + 1.96 + 11.56 = 23.2,
    # population var 4.64, sample std sqrt(23.2 / 4) = 2.408319
    moments = RunningMoments()
    assert moments.update(torch.tensor([1.0, 2.0, 3.0])) == pytest.approx((2.0, 1.0))
    assert (moments.mean, moments.var, moments.std) == pytest.approx((2.0, 2 / 3, 1.0))
    assert moments.update(torch.tensor([5.0, 7.0])) == pytest.approx((6.0, math.sqrt(2.0)))
    assert (moments.mean, moments.var, moments.std, moments.count) == pytest.approx((3.6, 4.64, 2.408319, 5))
    close(moments.normalize(torch.tensor([3.6, 6.008319])), [0.0, 1.0])
    close(normalize_rewards(torch.tensor([1.0, 3.0]), 2.0, 0.5), [-2.0, 2.0])


def test_graded_terms_margin_weight_and_off_by_hand():
    strength = torch.tensor([1.0, 2.0, 1.5, 3.0])  # slightly, much, a mean of one of each, clamped to much
    # margin: much_margin * clamp(strength - 1, 0, 1) = 0.8 * (0, 1, 0.5, 1) = (0, 0.8, 0.4, 0.8); weight 1
    margin, weight = graded_terms(strength, "margin", much_margin=0.8)
    close(margin, [0.0, 0.8, 0.4, 0.8])
    close(weight, [1.0, 1.0, 1.0, 1.0])
    # weight: 1 + (much_weight - 1) * (0, 1, 0.5, 1) = 1 + 2 * (...) = (1, 3, 2, 3); margin 0
    margin, weight = graded_terms(strength, "weight", much_weight=3.0)
    close(margin, [0.0, 0.0, 0.0, 0.0])
    close(weight, [1.0, 3.0, 2.0, 3.0])
    margin, weight = graded_terms(strength, "off")
    close(margin, [0.0] * 4)
    close(weight, [1.0] * 4)
    with pytest.raises(ValueError, match="graded use"):
        graded_terms(strength, "both")


def test_bradley_terry_loss_with_margin_and_weight_by_hand():
    diff = torch.tensor([2.0, 1.0])
    # no margin, no weight: (softplus(-2) + softplus(-1)) / 2 = (0.126928 + 0.313262) / 2 = 0.220095
    close(bradley_terry_loss(diff), 0.220095)
    # margins (0, 1): softplus(0 - 2) = ln(1 + e^-2) = 0.126928, softplus(1 - 1) = ln 2 = 0.693147
    # weights (1, 2): (0.126928 + 2 * 0.693147) / 3 = 1.513222 / 3 = 0.504407
    close(bradley_terry_loss(diff, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0])), 0.504407)
    # a float margin of 1 for both: (softplus(-1) + softplus(0)) / 2 = (0.313262 + 0.693147) / 2 = 0.503204
    close(bradley_terry_loss(diff, 1.0), 0.503204)
