"""Batched answer generation: counts, finish reasons, left padding, seeding, and the default model's whole answers."""

import pytest
import torch

from rlhf.decode import position_ids_from_mask
from rlhf.generate import (
    decode_answers,
    encode_prompt,
    generate_answers,
    generate_tokens,
    pad_sequences,
    response_mask_until_eos,
)
from rlhf.generate import (
    pad_sequences as left_pad,  # the default side is left
)
from rlhf.models import load_causal_lm, load_tokenizer
from rlhf.sampling import Sampling

PROMPTS = ["Name a colour.", "Write one long sentence about the history of bridges in Europe.", "Hi"]


def test_every_prompt_gets_n_answers_and_a_cut_answer_has_exactly_the_limit(tiny_model, tokenizer):
    sampling = Sampling(max_new_tokens=6, temperature=1.0)
    result = generate_answers(tiny_model, tokenizer, PROMPTS, n_per_prompt=3, sampling=sampling, seed=1, batch_size=4)

    assert [len(row) for row in result.answers] == [3, 3, 3]
    for answer in (a for row in result.answers for a in row):
        # A random model over a 49k vocabulary practically never picks EOS in 6 draws.
        assert answer.finish_reason == "length"
        assert answer.n_tokens == 6
    assert result.stats["gen/answers"] == 9
    assert result.stats["gen/finished_share"] == 0.0
    assert result.stats["gen/mean_tokens"] == 6
    assert result.stats["gen/tokens_per_s"] > 0 and result.stats["time/generate_s"] > 0


def test_left_padded_batch_gives_the_same_greedy_answers_as_one_prompt_at_a_time(tiny_model, tokenizer):
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    batched = generate_answers(tiny_model, tokenizer, PROMPTS, n_per_prompt=1, sampling=greedy, batch_size=8).answers
    alone = [generate_answers(tiny_model, tokenizer, [p], n_per_prompt=1, sampling=greedy).answers[0] for p in PROMPTS]

    assert len({len(encode_prompt(tokenizer, p)) for p in PROMPTS}) == 3  # three widths: real padding in the batch
    assert len({row[0].text for row in alone}) == 3  # each prompt gets its own answer: the check can fail
    assert batched == alone  # same order as the prompts, same text and counts


def test_left_padded_tokens_match_unpadded_tokens(tiny_model, tokenizer):
    greedy = Sampling(max_new_tokens=8, temperature=0.0)  # "Hi" and "Name a colour." part at token 7
    encoded = [encode_prompt(tokenizer, p) for p in PROMPTS]
    batch = generate_tokens(tiny_model, tokenizer, encoded, greedy)

    assert batch.prompt_mask[2].tolist().count(0) == len(encoded[1]) - len(encoded[2])  # padding on the left
    assert batch.prompt_mask[2, -1] == 1
    for row, tokens in enumerate(encoded):
        single = generate_tokens(tiny_model, tokenizer, [tokens], greedy)
        assert batch.response_ids[row].tolist() == single.response_ids[0].tolist()
    assert len({tuple(row) for row in batch.response_ids.tolist()}) == 3
    assert batch.sequences.shape == batch.attention_mask.shape == (3, len(encoded[1]) + 8)


def test_generated_tokens_can_feed_a_training_forward_pass(tiny_model, tokenizer):
    # PPO gathers the log-probs of the sampled tokens with gradients on and masks them: autograd saves both the
    # token ids and the mask, which it refuses for tensors made under inference_mode.
    batch = generate_tokens(tiny_model, tokenizer, [encode_prompt(tokenizer, "Hi")], Sampling(max_new_tokens=3))
    width = batch.prompt_ids.shape[1]
    logits = tiny_model(input_ids=batch.sequences, attention_mask=batch.attention_mask).logits  # (1, P + 3, V)
    log_probs = logits[:, width - 1:-1].log_softmax(-1)  # (1, 3, V): position t predicts token t + 1
    taken = torch.gather(log_probs, 2, batch.response_ids.unsqueeze(-1)).squeeze(-1)  # (1, 3)
    (taken * batch.response_mask).sum().backward()
    assert tiny_model.lm_head.weight.grad is not None
    tiny_model.zero_grad(set_to_none=True)


def test_answers_are_sampled_with_our_settings_alone_whatever_the_model_ships(tiny_model, tokenizer):
    """[sampling] decides; a checkpoint's generation_config.json (Qwen ships a repetition penalty, top-k and top-p)
    does not add to it, not even top-k where [sampling] leaves it at 0 (transformers would fill in the model's)."""
    import copy

    from transformers import GenerationConfig

    sampling = Sampling(max_new_tokens=6, temperature=0.7, top_p=0.95, top_k=0, repetition_penalty=1.1)
    ours = generate_answers(tiny_model, tokenizer, PROMPTS, sampling=sampling, seed=3).answers
    shipping = copy.deepcopy(tiny_model)
    shipping.generation_config = GenerationConfig(
        do_sample=True, temperature=0.2, top_k=1, top_p=0.5, min_p=0.5, repetition_penalty=2.0, no_repeat_ngram_size=1,
        suppress_tokens=[tokenizer.eos_token_id], sequence_bias={(11,): 5.0}, eos_token_id=tokenizer.eos_token_id)
    assert generate_answers(shipping, tokenizer, PROMPTS, sampling=sampling, seed=3).answers == ours
    assert shipping.generation_config.top_k == 1  # the model's own settings are back after generating
    # the check can fail: given a say, the model's top_k 1 alone would make every answer the greedy one
    greedy = generate_answers(tiny_model, tokenizer, PROMPTS, sampling=Sampling(max_new_tokens=6, temperature=0))
    assert [row[:1] for row in ours] != greedy.answers


def test_a_seed_repeats_the_draws_and_leaves_the_callers_random_state_alone(tiny_model, tokenizer):
    sampling = Sampling(max_new_tokens=6, temperature=1.0)
    torch.manual_seed(123)
    first = generate_answers(tiny_model, tokenizer, PROMPTS, sampling=sampling, seed=7).answers
    after_generation = torch.rand(1)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    second = generate_answers(tiny_model, tokenizer, PROMPTS, sampling=sampling, seed=7).answers

    assert first == second
    assert first[0][0] != first[0][1]  # two samples of one prompt differ
    assert torch.equal(after_generation, expected_next)


def test_the_repetition_penalty_counts_the_answers_tokens_not_the_prompts(tiny_model_dir, tokenizer):
    # The tied tiny model greedily repeats the prompt's last token, "\n" (198), forever. A penalty over the prompt
    # would forbid it from the first step; over the answer only, the first "\n" is free and the second is not.
    tied = load_causal_lm(tiny_model_dir)
    prompt = [encode_prompt(tokenizer, "Hi")]
    plain = generate_tokens(tied, tokenizer, prompt, Sampling(max_new_tokens=3, temperature=0.0))
    penalised = generate_tokens(tied, tokenizer, prompt,
                                Sampling(max_new_tokens=3, temperature=0.0, repetition_penalty=100.0))
    assert prompt[0][-1] == 198 and plain.response_ids[0].tolist() == [198, 198, 198]
    assert penalised.response_ids[0, 0] == 198
    assert 198 not in penalised.response_ids[0, 1:].tolist()


def test_the_model_is_left_in_the_mode_it_was_in(tiny_model, tokenizer):
    tiny_model.train()
    generate_answers(tiny_model, tokenizer, ["Hi"], n_per_prompt=1, sampling=Sampling(max_new_tokens=2))
    assert tiny_model.training
    tiny_model.eval()


def test_response_mask_runs_to_the_first_eos_inclusive():
    eos = 2
    response = torch.tensor([
        [5, 6, eos, eos, eos],  # ended after 2 tokens; the rest is padding (pad == eos here)
        [5, 6, 7, 8, 9],  # cut at the limit
        [eos, eos, eos, eos, eos],  # ended at once: an empty answer
    ])
    mask, ended = response_mask_until_eos(response, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert ended.tolist() == [True, False, True]


def test_decoded_answers_count_tokens_without_the_eos(tokenizer):
    eos = tokenizer.eos_token_id
    hello = tokenizer("Hello there", add_special_tokens=False)["input_ids"]  # 2 tokens: "Hello", " there"
    response = torch.tensor([hello + [eos, eos], hello + hello])
    response_mask, ended = response_mask_until_eos(response, [eos])
    answers = decode_answers(tokenizer, response, response_mask, ended)

    assert [(a.text, a.n_tokens, a.finish_reason) for a in answers] == [
        ("Hello there", 2, "stop"),
        ("Hello thereHello there", 4, "length"),
    ]


def test_left_pad_puts_padding_first():
    ids, mask = left_pad([[7, 8, 9], [4]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_pad_sequences_on_the_right_keeps_each_row_at_position_zero():
    ids, mask = pad_sequences([[7, 8, 9], [4]], pad_id=0, side="right")
    assert ids.tolist() == [[7, 8, 9], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_position_ids_count_real_tokens_from_zero_and_give_padding_one():
    # left-padded row: real tokens at 2, 3, 4 -> 0, 1, 2; right-padded row: 0, 1, 2 then padding.
    # Padding gets 1, as transformers' generate gives it (any valid index: padded keys are masked).
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 1, 1]]


SHIPPED_PROMPTS = [  # of data/prompts.jsonl; at the defaults the model ended all 4 answers in under 300 tokens
    "How can I fall asleep faster at night?",
    "Give me three tips for staying focused while studying.",
]


@pytest.mark.slow
def test_the_default_model_finishes_its_answers_to_shipped_prompts_at_the_default_settings():
    tokenizer = load_tokenizer("default")
    model = load_causal_lm("default")
    result = generate_answers(model, tokenizer, SHIPPED_PROMPTS, n_per_prompt=2, sampling=Sampling(), seed=0)
    answers = [a for row in result.answers for a in row]
    # 32 of 32 answers to the first 16 shipped prompts ended at these settings (docs/benchmarks.md, "Whole answers");
    # allow one cut.
    assert sum(a.finish_reason == "stop" for a in answers) >= 3
    assert all(a.text for a in answers)
    assert all(a.n_tokens <= Sampling().max_new_tokens for a in answers)
