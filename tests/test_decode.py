"""The one decoding loop (rlhf.decode): the distribution it draws from, worked out by hand and against transformers'
processors; the same tokens as transformers' greedy `generate`; a prompt's KV shared by its answers; rows dropped as
they end without changing the others."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from rlhf.decode import DecodeHooks, EndTokens, choose_tokens, decode, next_token_logits, penalise_repeats, race
from rlhf.generate import encode_prompt, pad_sequences
from rlhf.models import load_causal_lm
from rlhf.sampling import Sampling
from rlhf.warping import FIRST_CANDIDATES, candidate_logits, top_k_removed, top_p_removed

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello there", "what is two plus two, and why", "tell me a joke", "name a colour"]


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_once_per_token():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    # tokens 0 (twice) and 1 were written: 2 / 2 = 1, -2 * 2 = -4; tokens 2 and 3 untouched
    assert penalise_repeats(logits, torch.tensor([[0, 1, 0]]), 2.0).tolist() == [[1.0, -4.0, 1.0, 0.5]]
    assert penalise_repeats(logits, torch.zeros(1, 0, dtype=torch.long), 2.0) is logits  # nothing written yet


def test_eos_is_held_back_until_min_new_tokens_are_written():
    sampling = Sampling(max_new_tokens=5, min_new_tokens=2, repetition_penalty=1.0)
    logits = torch.zeros(1, 4)
    early = next_token_logits(logits, torch.tensor([[3]]), sampling, (0, 2))  # one token written: EOS ids barred
    assert early.tolist() == [[-math.inf, 0.0, -math.inf, 0.0]]
    assert next_token_logits(logits, torch.tensor([[3, 3]]), sampling, (0, 2)).tolist() == [[0.0] * 4]


def test_candidates_are_the_tokens_top_k_and_top_p_keep_even_where_the_nucleus_is_wide():
    torch.manual_seed(0)
    peaked = torch.randn(3, 5000) * 4  # (B, V): a small nucleus
    flat = torch.randn(3, 5000) * 0.1  # a nucleus of thousands of tokens: the first 64 candidates are widened
    for logits in (peaked, flat):
        for top_k, top_p in ((0, 0.9), (50, 1.0), (200, 0.8), (0, 0.999)):
            values, ids = candidate_logits(logits, top_k, top_p)
            removed = torch.zeros_like(logits, dtype=torch.bool)
            work = logits
            if top_k:
                removed |= top_k_removed(work, top_k)
                work = work.masked_fill(removed, -math.inf)
            if top_p < 1:
                removed |= top_p_removed(work, top_p)
            for row in range(logits.shape[0]):
                kept = set(ids[row][torch.isfinite(values[row])].tolist())
                assert kept == set((~removed[row]).nonzero().flatten().tolist())
    assert candidate_logits(flat, 0, 0.999)[0].shape[1] > FIRST_CANDIDATES


def test_draws_follow_the_warped_distribution_worked_out_by_hand():
    # probabilities .1 .2 .3 .4; at T = 0.5 they become .01 .04 .09 .16 (/ .30); top-p 0.8 keeps the tokens with less
    # than 0.8 of the mass above them: token 3 (0), token 2 (.16/.30 = .53); token 1 has .83 above it and goes.
    # So p(2) = .09 / .25 = 0.36 and p(3) = 0.64.
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(20000, 4)
    sampling = Sampling(max_new_tokens=1, temperature=0.5, top_p=0.8)
    torch.manual_seed(0)
    tokens, log_probs = choose_tokens(logits, sampling, with_log_probs=True)
    counts = torch.bincount(tokens, minlength=4).tolist()
    assert counts[0] == counts[1] == 0
    assert counts[2] / 20000 == pytest.approx(0.36, abs=0.015)  # 4 standard errors (0.0034)
    assert log_probs[tokens == 2].unique().tolist() == pytest.approx([math.log(0.36)], abs=1e-5)
    assert log_probs[tokens == 3].unique().tolist() == pytest.approx([math.log(0.64)], abs=1e-5)


def test_the_race_never_picks_a_token_of_probability_zero():
    probs = torch.tensor([0.0, 1e-30, 0.0, 1.0]).expand(50000, 4)
    torch.manual_seed(0)
    assert set(race(probs).tolist()) <= {1, 3}


def test_greedy_decoding_writes_what_transformers_generate_writes(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    ids, mask = pad_sequences([encode_prompt(tokenizer, p) for p in PROMPTS], tokenizer.pad_token_id)
    eos = tokenizer.eos_token_id
    ours = decode(model, ids, mask, Sampling(max_new_tokens=12, temperature=0, repetition_penalty=1.3),
                  EndTokens((eos,), tokenizer.pad_token_id)).response
    # transformers' greedy generate with nothing but these settings: the model's own generation config blanked
    model.generation_config = GenerationConfig()
    theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(
        do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id),
        logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(
            1.3, prompt_ignore_length=ids.shape[1])]))[:, ids.shape[1]:]
    assert torch.equal(ours, theirs)


def test_a_prompts_kv_serves_all_its_answers(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    greedy = Sampling(max_new_tokens=8, temperature=0)
    ends = EndTokens((tokenizer.eos_token_id,), tokenizer.pad_token_id)
    encoded = [encode_prompt(tokenizer, p) for p in PROMPTS]
    shared = decode(model, *pad_sequences(encoded, tokenizer.pad_token_id), greedy, ends, n_per_prompt=3).response
    repeated = [tokens for tokens in encoded for _ in range(3)]
    alone = decode(model, *pad_sequences(repeated, tokenizer.pad_token_id), greedy, ends).response
    assert shared.shape[0] == 3 * len(PROMPTS)
    assert torch.equal(shared, alone)


def test_rows_that_end_leave_the_batch_and_the_others_write_what_they_would_alone(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    encoded = [encode_prompt(tokenizer, p) for p in PROMPTS]
    # the penalty keeps the tiny model's greedy answers from repeating one token
    greedy = Sampling(max_new_tokens=10, temperature=0, repetition_penalty=3.0)
    alone = decode(model, *pad_sequences(encoded, tokenizer.pad_token_id), greedy,
                   EndTokens((), tokenizer.pad_token_id)).response  # (4, 10), no row ends
    # make each row end where its greedy answer writes a token chosen to be row 0's 3rd and row 1's 6th
    ends = (int(alone[0, 2]), int(alone[1, 5]))
    seen = []
    decoded = decode(model, *pad_sequences(encoded, tokenizer.pad_token_id), greedy, EndTokens(ends, -1),
                     hooks=DecodeHooks(row_end=lambda row, tokens: seen.append((row, tokens.tolist()))))
    for row in range(len(PROMPTS)):
        written = alone[row].tolist()
        first_end = next((t for t, token in enumerate(written) if token in ends), None)
        expected = written if first_end is None else written[:first_end + 1] + [-1] * (9 - first_end)
        assert decoded.response[row].tolist() == expected[:decoded.response.shape[1]]
        assert bool(decoded.ended[row]) == (first_end is not None)
        if first_end is not None:
            assert (row, written[:first_end]) in seen  # handed over with its tokens before the EOS
    assert 1 < decoded.response.shape[1] and sum(decoded.ended.tolist()) >= 2  # rows ended at different steps
    assert len({len(tokens) for _, tokens in seen}) >= 2
