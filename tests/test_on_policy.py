"""PPO samples on-policy with any model: the log-probs recorded while sampling equal the trainer's, whatever the model's
own generation_config ships and whatever [ppo.sampling] sets (temperature, top-k, top-p, min_new_tokens, the
repetition penalty)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhf.generate import encode_prompt, response_mask_until_eos
from rlhf.decode import decode
from rlhf.models import load_causal_lm
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.ppo.experience import response_log_probs
from rlhf.ppo.trainer import PPOTrainer
from rlhf.reward.model import RewardModel
from rlhf.sampling import Sampling
from rlhf.warping import min_new_tokens_removed, top_k_removed, top_p_removed, warp_logits

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello there", "what is two plus two", "tell me a joke", "name a colour"]
NEG = float("-inf")


def only(**settings) -> Sampling:
    """These settings and nothing else: temperature 1, no top-k, top-p or repetition penalty unless given."""
    return Sampling(**{"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, **settings})


# ----- the warpers, on logits worked out by hand -----


def test_top_k_keeps_the_k_largest_and_ties_with_the_kth():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0])
    assert top_k_removed(logits, 2).tolist() == [True, False, True, False]
    assert top_k_removed(logits, 3).tolist() == [True, False, False, False]
    assert top_k_removed(logits, 1).tolist() == [True, False, True, False]  # the tie with the largest stays


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    # ascending cumulative probabilities 0.1, 0.3, 0.6, 1.0: those <= 1 - p go
    assert top_p_removed(logits, 0.65).tolist() == [True, True, False, False]
    assert top_p_removed(logits, 0.8).tolist() == [True, False, False, False]
    assert top_p_removed(logits, 0.01).tolist() == [True, True, True, False]  # the most likely always stays


def test_min_new_tokens_holds_back_every_eos_id_at_the_first_positions():
    removed = min_new_tokens_removed(torch.zeros(1, 3, 4), eos_ids=(0, 2), min_new_tokens=2)
    assert removed[0].tolist() == [[True, False, True, False], [True, False, True, False], [False] * 4]


def test_warping_runs_eos_then_temperature_then_top_k_then_top_p():
    # EOS (id 0) first: with it gone, top-2 keeps tokens 1 and 2; top-k before the EOS mask would keep token 1 alone
    logits = torch.tensor([[[5.0, 4.0, 3.0, 1.0], [5.0, 4.0, 3.0, 1.0]]])  # (1, 2, 4)
    tokens = torch.tensor([[1, 0]])
    warped = warp_logits(logits, tokens, only(top_k=2, min_new_tokens=1), eos_ids=(0,))
    log_probs = warped.log_softmax(-1)
    assert log_probs[0, 0, 1].item() == pytest.approx(4 - math.log(math.exp(4) + math.exp(3)))
    assert log_probs[0, 1, 0].item() == pytest.approx(5 - math.log(math.exp(5) + math.exp(4)))  # EOS allowed at t=1
    # temperature before top-p: at T = 0.5 the probabilities [.1, .2, .3, .4] become [.01, .04, .09, .16] / .3, and
    # top-p 0.8 keeps tokens 2 and 3 (at T = 1 it would keep 1, 2 and 3): p(2) = .09 / (.09 + .16) = 0.36
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().view(1, 1, 4)
    warped = warp_logits(logits, torch.tensor([[2]]), only(temperature=0.5, top_p=0.8))
    assert warped.log_softmax(-1)[0, 0, 2].item() == pytest.approx(math.log(0.36), abs=1e-6)


def test_the_repetition_penalty_counts_the_tokens_written_before_each_position():
    # response tokens 2, 0, 2: position 0 has written nothing, position 1 has written 2, position 2 has written 2 and 0
    tokens = torch.tensor([[2, 0, 2]])
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]]).expand(1, 3, 4)  # (1, 3, 4)
    warped = warp_logits(logits, tokens, only(repetition_penalty=2.0))
    assert warped[0].tolist() == [[2.0, -2.0, 1.0, 0.5],  # nothing written yet
                                  [2.0, -2.0, 0.5, 0.5],  # token 2 (positive): 1 / 2
                                  [1.0, -2.0, 0.5, 0.5]]  # and token 0: 2 / 2; token 1 (negative) never written
    negative = warp_logits(torch.tensor([[[-1.0, 3.0]]]).expand(1, 2, 2), torch.tensor([[0, 1]]),
                           only(repetition_penalty=2.0))
    assert negative[0, 1].tolist() == [-2.0, 3.0]  # a negative logit is multiplied
    # before the temperature, as transformers orders its processors: (2 / 2) / 0.5 = 2 for token 0 at position 2
    assert warp_logits(logits, tokens, only(repetition_penalty=2.0, temperature=0.5))[0, 2, 0].item() == 2.0


def test_warping_equals_transformers_processors_on_random_logits():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50) * 3  # (B, T, V)
    tokens = torch.randint(0, 50, (3, 5))
    settings = dict(temperature=0.7, top_k=12, top_p=0.8, min_new_tokens=2, repetition_penalty=1.5)
    eos = torch.tensor([4, 9])
    prompt = 6
    processors = LogitsProcessorList([
        MinNewTokensLengthLogitsProcessor(prompt, settings["min_new_tokens"], eos),
        RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"], prompt_ignore_length=prompt),
        TemperatureLogitsWarper(settings["temperature"]),
        TopKLogitsWarper(settings["top_k"]),
        TopPLogitsWarper(settings["top_p"]),
    ])
    written = torch.cat([torch.full((3, prompt), 49, dtype=torch.long), tokens], dim=1)  # prompt, then the response
    expected = torch.stack([processors(written[:, :prompt + t], logits[:, t]) for t in range(5)], dim=1)  # (B, T, V)
    warped = warp_logits(logits, tokens, only(**settings), eos_ids=(4, 9))
    kept = torch.isfinite(expected)
    kept.scatter_(-1, tokens.unsqueeze(-1), True)  # plus the sampled token (see below)
    assert torch.equal(torch.isfinite(warped), kept)
    assert torch.equal(warped[torch.isfinite(expected)], expected[torch.isfinite(expected)])


def test_a_sampled_token_the_warping_would_drop_still_scores_finitely():
    # the training pass's logits differ from the sampling pass's in the last bits and may move a token across the
    # top-k boundary: its log-prob must stay finite (no NaN loss), over the kept tokens plus itself
    logits = torch.tensor([[[1.0, 3.0, 2.0]]], requires_grad=True)
    warped = warp_logits(logits, torch.tensor([[0]]), only(top_k=1))
    log_prob = warped.log_softmax(-1)[0, 0, 0]
    assert log_prob.item() == pytest.approx(1 - math.log(math.exp(1) + math.exp(3)))
    log_prob.backward()
    assert logits.grad[0, 0, 2] == 0 and torch.isfinite(logits.grad).all()  # the removed token gets no gradient


def test_ppo_refuses_sampling_settings_it_cannot_take_log_probs_of():
    for settings, message in [({"top_k": -1}, "top_k must be 0"), ({"top_p": 0.0}, "top_p must be above 0"),
                              ({"top_p": 1.5}, "at most 1"), ({"min_new_tokens": -2}, "min_new_tokens must be 0")]:
        with pytest.raises(ValueError, match=message):
            PPOConfig(sampling=rollout_sampling(**settings))


# ----- whatever the model ships, sampling is ours -----


SHIPPED = {
    "repetition_penalty": {"repetition_penalty": 1.1},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 3},
    "min_p": {"min_p": 0.1},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.8},
    "everything": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "min_p": 0.2, "top_k": 3, "top_p": 0.5,
                   "typical_p": 0.9, "epsilon_cutoff": 0.01, "suppress_tokens": [5], "begin_suppress_tokens": [6],
                   "sequence_bias": {(7,): 2.0}, "forced_eos_token_id": 2, "renormalize_logits": True,
                   "temperature": 0.3, "do_sample": False},
}


def shipping(model, settings: dict):
    """`model` as if its generation_config.json held `settings` (its token ids kept)."""
    ids = {key: getattr(model.generation_config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    model.generation_config = GenerationConfig(**{"do_sample": True, **ids, **settings})
    return model


@pytest.mark.parametrize("shipped", list(SHIPPED))
def test_a_models_own_generation_config_changes_nothing_sampled(narrow_model_dir, module_tokenizer, shipped):
    tokenizer = module_tokenizer
    config = PPOConfig(seed=3, mixed_precision="no", sampling=rollout_sampling(max_new_tokens=8, temperature=0.7))
    draws = []
    for settings in ({}, SHIPPED[shipped]):
        model = shipping(load_causal_lm(narrow_model_dir).eval(), settings)
        critic = RewardModel.from_causal_lm(narrow_model_dir)
        trainer = PPOTrainer(model, critic, tokenizer, config, reward_model=critic, reference=model)
        torch.manual_seed(0)
        draws.append(trainer.generate(PROMPTS)[0])
    assert torch.equal(draws[0], draws[1])
    key, value = next(iter(SHIPPED[shipped].items()))
    assert getattr(model.generation_config, key) == value  # the model's own file is left as it was


@pytest.fixture(scope="module")
def narrow_model_dir(tmp_path_factory, tiny_model_dir, module_tokenizer) -> Path:
    """A tiny model that repeats itself and may end: its output layer is its embeddings x 12 (the next token resembles
    the last one, so n-grams repeat) and EOS's row is the newline's x 0.9 (EOS is likely after a newline, and every
    prompt ends with one). Every setting under test changes what it samples.
    """
    model = load_causal_lm(tiny_model_dir)
    newline = encode_prompt(module_tokenizer, "hi")[-1]
    with torch.no_grad():
        rows = model.model.embed_tokens.weight.detach().clone() * 12.0  # (V, D)
        rows[module_tokenizer.eos_token_id] = rows[newline] * 0.9
    model.lm_head.weight = torch.nn.Parameter(rows)
    model.config.tie_word_embeddings = False
    out = tmp_path_factory.mktemp("narrow-model")
    model.save_pretrained(out)
    module_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def module_tokenizer(tiny_model_dir):
    from rlhf.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


CASES = [(name, settings, {}) for name, settings in SHIPPED.items()] + [
    ("ppo top_k", {}, {"top_k": 5}),
    ("ppo top_p", {}, {"top_p": 0.8}),
    ("ppo min_new_tokens", {}, {"min_new_tokens": 4}),
    ("ppo all, model ships a penalty", {"repetition_penalty": 1.1, "min_p": 0.1},
     {"top_k": 20, "top_p": 0.9, "min_new_tokens": 3}),
    ("ppo repetition_penalty", {}, {"repetition_penalty": 1.3}),
    ("ppo penalty with top_p", {}, {"repetition_penalty": 1.2, "top_p": 0.9}),
]


@pytest.mark.parametrize("name, shipped, ppo", CASES, ids=[case[0] for case in CASES])
def test_log_probs_recorded_while_sampling_equal_the_trainers(narrow_model_dir, module_tokenizer, name, shipped, ppo):
    tokenizer = module_tokenizer
    model = shipping(load_causal_lm(narrow_model_dir).eval(), shipped)
    critic = RewardModel.from_causal_lm(narrow_model_dir)
    config = PPOConfig(seed=3, mixed_precision="no",
                       sampling=rollout_sampling(max_new_tokens=12, temperature=0.7, **ppo))
    trainer = PPOTrainer(model, critic, tokenizer, config, reward_model=critic,
                         reference=shipping(load_causal_lm(narrow_model_dir), shipped))
    batch = trainer.encode_prompts(PROMPTS)
    with torch.no_grad():
        torch.manual_seed(0)
        decoded = decode(model, batch["input_ids"], batch["attention_mask"], config.sampling, trainer.ends,
                         with_log_probs=True)
        chosen, width = decoded.response, decoded.response.shape[1]  # (B, T)
        sampled_from = decoded.log_probs  # (B, T): each token's log-prob under what it was drawn from
        sequences = torch.cat([batch["input_ids"], chosen], dim=1)
        action_mask, _ = response_mask_until_eos(chosen, list(trainer.ends.eos_ids))
        attention_mask = torch.cat([batch["attention_mask"], action_mask], dim=1)
        log_probs, _, entropy = trainer.trainable_forward(sequences, attention_mask, width)
        reference = trainer.reference_log_probs(sequences, attention_mask, width)
    real = action_mask.bool()
    # fp32 rounding of the cached decoding against the full pass, on logits this sharp (x12): up to 3.3e-5 measured on
    # an AVX2 CPU (under 1e-5 with AVX512); any other distribution is off by more than 1e-3 (the teeth below)
    assert (log_probs - sampled_from)[real].abs().max().item() < 1e-4
    assert torch.allclose(reference, log_probs, atol=1e-6)  # actor == reference: no KL
    assert torch.isfinite(log_probs).all() and torch.isfinite(entropy).all()  # padding after EOS too
    # the case has teeth: the log-probs the trainer took before (softmax(logits / T) alone) are of another distribution
    if ppo:
        tempered, _ = response_log_probs(model, sequences, attention_mask, width, sampling=only(temperature=0.7))
        assert (tempered - sampled_from)[real].abs().max().item() > 1e-3
    # and so is what generate() sampled from before, with the fields it left unset filled from the model's file
    if set(shipped) & {"repetition_penalty", "no_repeat_ngram_size", "min_p"}:
        before = GenerationConfig(do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=12,
                                  min_new_tokens=config.sampling.min_new_tokens,
                                  eos_token_id=list(trainer.ends.eos_ids),
                                  pad_token_id=tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True)
        with torch.no_grad():
            torch.manual_seed(0)
            old = model.generate(**batch, generation_config=before)
            old_width = len(old.scores)
            old_chosen = old.sequences[:, -old_width:]  # (B, T')
            old_from = torch.stack(old.scores, 1).log_softmax(-1).gather(-1, old_chosen.unsqueeze(-1)).squeeze(-1)
            old_mask, _ = response_mask_until_eos(old_chosen, list(trainer.ends.eos_ids))
            old_attention = torch.cat([batch["attention_mask"], old_mask], dim=1)
            old_trained = response_log_probs(model, old.sequences, old_attention, old_width,
                                             sampling=only(temperature=0.7))[0]
        assert (old_trained - old_from)[old_mask.bool()].abs().max().item() > 1e-3
