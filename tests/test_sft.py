"""SFT: answer-only labels, the loss, data file errors, learning a fixed answer, and the --sft command."""

import json
import math

import pytest
import torch

import app
from rlhf.generate import encode_prompt, generate_answers
from rlhf.sampling import Sampling
from rlhf.models import load_causal_lm, load_tokenizer
from rlhf.sft.train import (
    IGNORE_INDEX,
    SFTConfig,
    SFTDataError,
    answer_token_loss,
    collate_right_padded,
    encode_example,
    linear_warmup_decay,
    sft_examples_from_jsonl,
    train_sft,
)


def test_prompt_tokens_carry_no_label_and_the_answer_ends_with_eos(tokenizer):
    prompt_ids = encode_prompt(tokenizer, "Hi")  # the chat template around "Hi": 31 tokens
    ids, labels, truncated = encode_example(tokenizer, "Hi", "blue sky", max_length=64)

    eos = tokenizer.eos_token_id
    assert len(prompt_ids) == 31
    assert ids == prompt_ids + [16591, 6376, eos]  # "blue" " sky" <|im_end|>
    assert labels == [IGNORE_INDEX] * 31 + [16591, 6376, eos]
    assert not truncated


def test_a_long_example_keeps_the_end_of_its_prompt_then_cuts_the_answer(tokenizer):
    ids, labels, truncated = encode_example(tokenizer, "Hi", "blue sky " * 20, max_length=20)
    prompt_ids = encode_prompt(tokenizer, "Hi")
    assert truncated
    assert len(ids) == len(labels) == 20
    assert ids[:10] == prompt_ids[-10:]  # max_length // 2 prompt tokens, the last ones
    assert labels[:10] == [IGNORE_INDEX] * 10
    assert labels[10:] == ids[10:] and ids[10:12] == [16591, 6376]


def test_padding_is_on_the_right_and_carries_no_label():
    batch = collate_right_padded([([5, 6, 7], [-100, 6, 7]), ([8], [-100])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, -100, -100]]


def test_the_loss_counts_only_labelled_tokens_predicted_from_the_previous_position():
    # Vocabulary of 2. Labels [-100, -100, 1]: only the logits at position 1 (predicting position 2) count.
    # Those are [0, 0]: p(token 1) = 1/2, loss = ln 2 = 0.6931. Position 0's logits [5, -5] and position 2's
    # (nothing after it) must not matter.
    logits = torch.tensor([[[5.0, -5.0], [0.0, 0.0], [3.0, 1.0]]])  # (1, 3, 2)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 1]])  # (1, 3)
    assert answer_token_loss(logits, labels).item() == pytest.approx(math.log(2))
    # Two labelled tokens: position 0 -> label 0 with logits [ln 3, 0]: p = 3/4, loss ln(4/3) = 0.2877;
    # mean with ln 2: (0.2877 + 0.6931) / 2 = 0.4904.
    logits[0, 0] = torch.tensor([math.log(3), 0.0])
    labels = torch.tensor([[IGNORE_INDEX, 0, 1]])
    assert answer_token_loss(logits, labels).item() == pytest.approx((math.log(4 / 3) + math.log(2)) / 2)


def test_learning_rate_warms_up_then_decays_linearly():
    # 10 steps, 2 of warmup: 1/3, 2/3, then (10 - s) / 8 from step 2.
    factors = [linear_warmup_decay(step, total=10, warmup=2) for step in range(10)]
    assert factors == pytest.approx([1 / 3, 2 / 3, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_jsonl_of_prompts_and_responses_is_read_blank_lines_allowed(tmp_path):
    path = write_lines(tmp_path / "demo.jsonl", [
        json.dumps({"prompt": "Hi", "response": "Hello!"}), "",
        json.dumps({"prompt": "2+2?", "response": "4", "source": "extra keys are fine"}),
    ])
    assert sft_examples_from_jsonl(path) == [("Hi", "Hello!"), ("2+2?", "4")]


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", r"demo.jsonl:2: not valid JSON"),
    ('["Hi", "Hello"]', r"demo.jsonl:2: expected a JSON object"),
    ('{"prompt": "Hi"}', r"demo.jsonl:2: \"response\" must be a non-empty string \(the object has: prompt\)"),
    ('{"prompt": "  ", "response": "x"}', r"demo.jsonl:2: \"prompt\" must be a non-empty string"),
    ('{"prompt": "Hi", "response": 4}', r"demo.jsonl:2: \"response\" must be a non-empty string"),
])
def test_a_bad_line_is_named_with_file_and_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "demo.jsonl", [json.dumps({"prompt": "a", "response": "b"}), bad_line])
    with pytest.raises(SFTDataError, match=message):
        sft_examples_from_jsonl(path)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    with pytest.raises(SFTDataError, match="holds no examples"):
        sft_examples_from_jsonl(write_lines(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(SFTDataError, match="no such file"):
        sft_examples_from_jsonl(tmp_path / "missing.jsonl")


def test_sft_lowers_the_loss_and_the_model_learns_to_give_the_answer(tiny_model_dir, tmp_path):
    # One demonstration, 60 steps: the random 2-layer model needs that many to stop predicting the same
    # mixture of the answer's tokens at every position and condition on the one before.
    examples = [("What colour is the sky?", "blue sky")]
    config = SFTConfig(learning_rate=1e-2, epochs=60, batch_size=1, warmup_ratio=0.0, seed=0)
    result = train_sft(tiny_model_dir, examples, config, tmp_path / "sft", show_bar=False)

    assert result.steps == 60 and result.examples == 1 and result.truncated == 0
    assert result.losses[-1] < 0.05 * result.losses[0]
    assert (tmp_path / "sft" / "model.safetensors").is_file()
    model, tokenizer = load_causal_lm(tmp_path / "sft"), load_tokenizer(tmp_path / "sft")
    greedy = Sampling(max_new_tokens=6, temperature=0.0)
    (answer,), = generate_answers(model, tokenizer, ["What colour is the sky?"], 1, greedy).answers
    assert (answer.text, answer.n_tokens, answer.finish_reason) == ("blue sky", 2, "stop")


def sft_argv(db, model, sft=None, out=None):
    """`app.py --sft [FILE]` on `db` with `model`, one epoch."""
    return ["--sft", *([str(sft)] if sft else []), "--db", str(db), "--model", str(model), "--sft-epochs", "1",
            *(["--out", str(out)] if out else [])]


def test_sft_command_records_the_model_as_the_new_reference(tiny_model_dir, tmp_path, capsys):
    from annotate.store import Store

    data = write_lines(tmp_path / "demo.jsonl", [json.dumps({"prompt": "Hi", "response": "Hello!"})])
    code = app.main(sft_argv(tmp_path / "loop.db", tiny_model_dir, sft=str(data), out=tmp_path / "sft"))

    assert code == 0
    with Store(tmp_path / "loop.db") as store:
        base, sft = store.policies()
        assert (base.round, base.path, base.parent_id) == (0, str(tiny_model_dir), None)
        assert (sft.round, sft.path, sft.parent_id) == (0, str(tmp_path / "sft"), base.id)
        assert store.first_policy() == sft and store.latest_policy() == sft
    assert "recorded as policy" in capsys.readouterr().out


def test_sft_command_trains_on_the_annotators_demonstrations(tiny_model_dir, tmp_path):
    from annotate.store import Store

    with Store(tmp_path / "loop.db") as store:
        store.add_prompts(["Hi"])
        store.add_demonstration(store.prompts()[0].id, "ann", "Hello, how can I help?")
    assert app.main(sft_argv(tmp_path / "loop.db", tiny_model_dir, out=tmp_path / "sft")) == 0
    assert (tmp_path / "sft" / "config.json").is_file()


def test_sft_command_without_demonstrations_or_with_a_bad_file_says_what_to_do(tiny_model_dir, tmp_path, capsys):
    from annotate.store import Store

    Store(tmp_path / "loop.db").close()  # a database without demonstrations (a missing one: test_operator_errors.py)
    assert app.main(sft_argv(tmp_path / "loop.db", tiny_model_dir)) == 2
    assert "holds no demonstrations yet" in capsys.readouterr().err

    bad = write_lines(tmp_path / "bad.jsonl", ['{"prompt": "Hi"}'])
    assert app.main(sft_argv(tmp_path / "loop.db", tiny_model_dir, sft=str(bad))) == 2
    assert 'bad.jsonl:1: "response" must be a non-empty string' in capsys.readouterr().err


@pytest.mark.parametrize("trainer", ["sft", "reward"])
def test_the_fsdp2_engine_refuses_an_unknown_engine_and_a_lone_process(trainer, tiny_model_dir, tmp_path):
    """engine = fsdp2 of [sft] and [reward] shards over a launcher's processes (tests/test_multiprocess.py runs it);
    a lone process is refused before any step, and a misspelt engine when the settings are made."""
    from rlhf.reward.config import RewardTrainConfig
    from rlhf.reward.data import PreferencePair
    from rlhf.reward.train import train_reward_model
    from rlhf.sft.config import SFTConfig

    make = SFTConfig if trainer == "sft" else RewardTrainConfig
    with pytest.raises(ValueError, match="engine must be one of ddp, fsdp2, not 'zero3'"):
        make(engine="zero3")
    with pytest.raises(ValueError, match="needs the processes a launcher starts"):
        if trainer == "sft":
            train_sft(tiny_model_dir, [("Hi?", "Hello.")], SFTConfig(engine="fsdp2"), tmp_path / "sft", show_bar=False)
        else:
            pairs = [PreferencePair(f"Say hi {i}.", f"Hello {i}.", f"Go away {i}.") for i in range(8)]
            train_reward_model(pairs, RewardTrainConfig(model=str(tiny_model_dir), engine="fsdp2", min_pairs=2,
                                                        show_progress=False, max_length=32))
