"""Reward model: scores at the last real token, pairs batched and truncated, training, save/load, the command.

The loss maths is tested in test_losses.py; these tests check how the model, the data and the loop use it.
"""

import json
import random

import pytest
import torch

import app
from rlhf.models import format_prompt
from rlhf.reward.model import RewardModel, is_reward_model_dir
from rlhf.reward.data import (
    PairCollator,
    PreferenceDataError,
    PreferencePair,
    TokenizedPair,
    heldout_accuracies,
    load_preference_file,
    prompt_position,
    split_pairs,
    tokenize_pairs,
    truncate_pair,
)
from rlhf.reward.train import RewardTrainConfig, batch_loss, train_reward_model

MARKER = "banana"
WORDS = "river cloud stone table window garden paper music orange simple quick yellow ocean forest bright".split()


pytestmark = pytest.mark.usefixtures("one_thread")


def marker_pairs(n: int, seed: int) -> list[PreferencePair]:
    """Answers of five random words; the chosen one also holds MARKER somewhere, the rejected one does not."""
    rng = random.Random(seed)

    def answer(with_marker: bool) -> str:
        words = rng.sample(WORDS, 5)
        if with_marker:
            words.insert(rng.randrange(6), MARKER)
        return " ".join(words)

    return [PreferencePair(f"Tell me about the {rng.choice(WORDS)}.", answer(True), answer(False)) for _ in range(n)]


# ---- the model --------------------------------------------------------------------------------------


def test_score_is_the_value_at_the_last_real_token_under_left_and_right_padding(tiny_model_dir):
    model = RewardModel.from_causal_lm(tiny_model_dir).eval()
    rows = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    pad = 0
    with torch.no_grad():
        alone = torch.cat([model.forward_value(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)).scores
                           for r in rows])  # (3,)
        for side in ("right", "left"):
            ids = torch.full((3, 5), pad)
            mask = torch.zeros((3, 5), dtype=torch.long)
            for i, row in enumerate(rows):
                span = slice(0, len(row)) if side == "right" else slice(5 - len(row), 5)
                ids[i, span], mask[i, span] = torch.tensor(row), 1
            output = model.forward_value(ids, mask)
            last = [len(r) - 1 for r in rows] if side == "right" else [4, 4, 4]
            assert torch.equal(output.scores, output.values[torch.arange(3), torch.tensor(last)]), side
            # padding changes neither which token is scored nor the score (positions count real tokens only)
            torch.testing.assert_close(output.scores, alone, atol=1e-5, rtol=1e-5, msg=side)
            changed_pad = torch.where(mask.bool(), ids, 99)
            torch.testing.assert_close(model.forward_value(changed_pad, mask).scores, output.scores,
                                       atol=1e-5, rtol=1e-5, msg=side)


def test_save_and_load_give_identical_scores(tiny_model_dir, tokenizer, tmp_path):
    torch.manual_seed(1)
    model = RewardModel.from_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        model.v_head.weight.normal_()  # a head unlike a fresh one, so loading a random head would show
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    folder = model.save_pretrained(tmp_path / "rm", tokenizer=tokenizer)
    assert is_reward_model_dir(folder)
    assert {"config.json", "model.safetensors", "v_head.safetensors", "reward_model.json",
            "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    assert not list(tmp_path.glob(".rm-*")), "the staging folder is renamed, not left behind"
    model.save_pretrained(folder, tokenizer=tokenizer)  # saving over an earlier model replaces it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"]
    loaded = RewardModel.from_pretrained(folder).eval()
    with torch.no_grad():
        before, after = model.forward_value(ids, mask), loaded.forward_value(ids, mask)
    assert torch.equal(before.values, after.values)
    assert torch.equal(before.scores, after.scores)


@pytest.mark.parametrize("pooling, layer", [("last", -1), ("mean", 1)])
def test_saving_a_gathered_state_dict_writes_those_weights(tiny_model_dir, tokenizer, tmp_path, pooling, layer):
    """ZeRO-3 / FSDP: the process that saves holds a shard; the gathered state dict must be what lands on disk."""
    torch.manual_seed(2)
    model = RewardModel(RewardModel.from_causal_lm(tiny_model_dir).backbone, pooling=pooling, layer=layer).eval()
    gathered = {key: value + 0.5 for key, value in model.state_dict().items()}  # unlike the weights held here
    folder = model.save_pretrained(tmp_path / "rm", tokenizer=tokenizer, state_dict=gathered)
    loaded = RewardModel.from_pretrained(folder).eval()
    assert loaded.pooling == pooling and loaded.layer == layer
    assert set(loaded.state_dict()) == set(gathered)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, gathered[key]), key


def test_loading_a_folder_that_is_not_a_reward_model_says_so(tiny_model_dir):
    from rlhf.models import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="not a reward model folder"):
        RewardModel.from_pretrained(tiny_model_dir)


def test_freeze_backbone_leaves_only_the_head_trainable(tiny_model_dir):
    model = RewardModel.from_causal_lm(tiny_model_dir)
    model.freeze_backbone()
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["v_head.weight"]


@pytest.mark.slow
def test_default_model_scores_agree_under_left_and_right_padding(real_tokenizer):
    model = RewardModel.from_causal_lm("default").eval()
    texts = ["The capital of France is Paris.", "Hi"]
    rows = [real_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    scores = {}
    with torch.no_grad():
        for side in ("left", "right"):
            real_tokenizer.padding_side = side
            batch = real_tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
            scores[side] = model.forward_value(batch["input_ids"], batch["attention_mask"]).scores  # (2,)
        alone = torch.cat([model.forward_value(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)).scores
                           for r in rows])
    torch.testing.assert_close(scores["left"], alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scores["right"], alone, atol=1e-4, rtol=1e-4)


# ---- pairs to tokens to batches ------------------------------------------------------------------


def test_truncation_cuts_the_prompt_from_the_left_by_the_same_amount_for_both_answers():
    prompt = list(range(100, 110))  # 10 tokens
    chosen, rejected = [1, 2, 3], [4, 5, 6, 7, 8]
    # room 12: the longer answer (5) leaves 7 for the prompt, so both keep the prompt's last 7 tokens
    pair = truncate_pair(prompt, chosen, rejected, max_length=12)
    assert pair.prompt_ids == [103, 104, 105, 106, 107, 108, 109]
    assert pair.chosen_answer_ids == [1, 2, 3] and pair.rejected_answer_ids == [4, 5, 6, 7, 8]
    assert pair.chosen_ids == [103, 104, 105, 106, 107, 108, 109, 1, 2, 3]
    # everything fits: nothing is cut
    assert truncate_pair([9], [1], [2, 3], max_length=12).rejected_ids == [9, 2, 3]
    # answers longer than the room: the prompt keeps half of max_length, answers keep their ends
    long_pair = truncate_pair(prompt, list(range(20)), list(range(50, 60)), max_length=8)
    assert long_pair.chosen_ids == [106, 107, 108, 109, 16, 17, 18, 19]
    assert long_pair.rejected_ids == [106, 107, 108, 109, 56, 57, 58, 59]


def test_tokenized_pair_is_formatted_prompt_then_answer_then_one_eos(tokenizer):
    pairs = [PreferencePair("Why is the sky blue?", "Rayleigh scattering.", "No idea" + tokenizer.eos_token)]
    [pair] = tokenize_pairs(tokenizer, pairs, max_length=512)
    prompt_ids = tokenizer(format_prompt(tokenizer, "Why is the sky blue?"), add_special_tokens=False)["input_ids"]
    chosen_ids = tokenizer("Rayleigh scattering.", add_special_tokens=False)["input_ids"]
    rejected_ids = tokenizer("No idea", add_special_tokens=False)["input_ids"]
    assert pair.chosen_ids == prompt_ids + chosen_ids + [tokenizer.eos_token_id]
    assert pair.rejected_ids == prompt_ids + rejected_ids + [tokenizer.eos_token_id]  # not a second EOS


PAIRS = [TokenizedPair([1, 2], [3], [4, 5]), TokenizedPair([6], [7], [8])]  # (prompt, chosen answer, rejected answer)


def test_collator_stacks_chosen_rows_then_rejected_rows_right_padded():
    batch = PairCollator(pad_token_id=0)(PAIRS)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [6, 7, 0, 0], [1, 2, 4, 5], [6, 8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert set(batch) == {"input_ids", "attention_mask"}


def test_shared_prompt_collator_holds_each_prompt_once_left_padded_and_answers_right_padded():
    batch = PairCollator(pad_token_id=0, share_prompt=True)(PAIRS)
    assert batch["prompt_ids"].tolist() == [[1, 2], [0, 6]]
    assert batch["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert batch["input_ids"].tolist() == [[3, 0], [7, 0], [4, 5], [8, 0]]
    assert batch["attention_mask"].tolist() == [[1, 0], [1, 0], [1, 1], [1, 0]]


@pytest.mark.parametrize("share_prompt, expected_calls", [
    (False, [torch.Size([4, 4])]),  # one pass over 2B whole sequences
    (True, [torch.Size([2, 2]), torch.Size([4, 2])]),  # the B prompts once, then the 2B answers
])
def test_chosen_and_rejected_go_through_the_model_together(tiny_model_dir, share_prompt, expected_calls):
    model = RewardModel.from_causal_lm(tiny_model_dir)
    shapes = []
    model.backbone.register_forward_hook(lambda module, args, kwargs, out: shapes.append(kwargs["input_ids"].shape),
                                         with_kwargs=True)
    batch = PairCollator(pad_token_id=0, share_prompt=share_prompt)(PAIRS)
    loss, chosen, rejected = batch_loss(model, batch, RewardTrainConfig())
    assert shapes == expected_calls
    assert chosen.shape == rejected.shape == (2,)
    whole = PairCollator(pad_token_id=0)(PAIRS)
    with torch.no_grad():
        scores = model.forward_value(whole["input_ids"], whole["attention_mask"]).scores  # (4,)
    torch.testing.assert_close(chosen, scores[:2])
    torch.testing.assert_close(rejected, scores[2:])
    assert loss.requires_grad


def test_sharing_the_prompt_gives_the_same_loss_and_gradients_as_whole_sequences(tiny_model_dir, tokenizer):
    pairs = tokenize_pairs(tokenizer, marker_pairs(3, seed=5) + [PreferencePair("Hi", "Hello there.", "Go.")], 128)
    config = RewardTrainConfig()
    results = {}
    for share_prompt in (False, True):
        model = RewardModel.from_causal_lm(tiny_model_dir)  # the same seeded head each time
        torch.manual_seed(0)
        model.v_head.reset_parameters()
        loss, chosen, rejected = batch_loss(model, PairCollator(tokenizer.pad_token_id, share_prompt)(pairs), config)
        loss.backward()
        results[share_prompt] = (loss, chosen, rejected, model.backbone.layers[0].self_attn.q_proj.weight.grad)
    for whole, shared in zip(results[False], results[True]):
        torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-4)


def test_a_pair_held_out_once_stays_held_out_in_every_later_round():
    """The bug this guards against: the seeded split by pair, drawn afresh each round (split_pairs(range(100), .1, 1)
    then split_pairs(range(140), .1, 2)), put 8 of round 2's 14 held-out pairs in round 1's training set, and the
    "full" strategy warm-starts from round 1's model. The split by a hash of the prompt needs no seed and no storage."""
    round_1 = [PreferencePair(f"Prompt number {i}.", "chosen", "rejected") for i in range(100)]
    round_2 = round_1 + [PreferencePair(f"Prompt number {i}.", "chosen", "rejected") for i in range(100, 140)]
    train_1, heldout_1 = split_pairs(round_1, 0.1)
    train_2, heldout_2 = split_pairs(round_2, 0.1)
    held = ["Prompt number 13.", "Prompt number 51.", "Prompt number 65.", "Prompt number 80.", "Prompt number 82.",
            "Prompt number 98."]
    assert [p.prompt for p in heldout_1] == [p.prompt for p in heldout_2] == held
    assert not set(heldout_2) & set(train_1)  # nothing held out in round 2 was trained on in round 1
    assert len(train_1) == 94 and len(train_2) == 134
    assert split_pairs(list(reversed(round_2)), 0.1)[1] == list(reversed(heldout_2))  # order does not matter


def test_the_split_is_by_prompt_so_no_prompt_is_on_both_sides():
    pairs = marker_pairs(120, seed=0)  # 15 prompts, 8 pairs each on average
    train, heldout = split_pairs(pairs, heldout_fraction=0.25)
    assert {p.prompt for p in heldout} == {"Tell me about the paper.", "Tell me about the window."}
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    assert (len(train), len(heldout)) == (104, 16)
    assert sorted(map(id, train + heldout)) == sorted(map(id, pairs))
    assert prompt_position("Tell me about the paper.") == float.fromhex("0x1.5d1ad7e837d62p-4")  # sha256, 0.085
    assert split_pairs(pairs, 0.0) == (pairs, [])


def test_few_prompts_may_hold_out_none_and_never_hold_out_all():
    none = [PreferencePair("Say hi.", "a", "b"), PreferencePair("Tell me a joke.", "c", "d")]  # at 0.88 and 0.57
    assert split_pairs(none, 0.1) == (none, [])
    # "p" sits at 0.08, under 0.1: the only prompt is not held out, or there would be nothing to train on
    alone = [PreferencePair("p", "c", "r")] * 3
    assert split_pairs(alone, 0.1) == (alone, [])
    # with "p" and "Say hi." under 0.9 both would be held out: the one placed higher ("Say hi.", 0.88) trains
    assert split_pairs(alone + none[:1], 0.9) == (none[:1], alone)


def test_held_out_accuracy_is_reported_by_source_and_the_sample_pairs_are_the_headline():
    pairs = [PreferencePair("q1", "c", "r", source="sample"), PreferencePair("q2", "c", "r"),  # no source: sample
             PreferencePair("q3", "c", "r", source="versus"), PreferencePair("q4", "c", "r", source="chosen"),
             PreferencePair("q5", "c", "r", source="chosen")]
    assert heldout_accuracies(pairs, [True, False, True, False, False]) == {
        "rm/n_heldout": 5,
        "rm/heldout_accuracy": 0.5, "rm/n_heldout_sample": 2,
        "rm/heldout_accuracy_versus": 1.0, "rm/n_heldout_versus": 1,
        "rm/heldout_accuracy_chosen": 0.0, "rm/n_heldout_chosen": 2,
    }
    assert heldout_accuracies(pairs[2:3], [True])["rm/heldout_accuracy"] is None  # no sample pair: not measured
    with pytest.raises(ValueError, match="source must be one of sample, versus, chosen"):
        PreferencePair("q", "c", "r", source="active")


def test_preference_files_read_from_jsonl_and_from_a_dataset_folder(tmp_path):
    import datasets

    rows = [{"prompt": "p1", "chosen": "c1", "rejected": "r1", "extra": 1}, {"prompt": "p2", "chosen": "c2",
                                                                               "rejected": "r2", "extra": 2}]
    jsonl = tmp_path / "prefs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    expected = [PreferencePair("p1", "c1", "r1"), PreferencePair("p2", "c2", "r2")]
    assert load_preference_file(jsonl) == expected
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    assert load_preference_file(tmp_path / "hf") == expected


def test_a_preference_file_keeps_the_strength_export_writes_and_refuses_a_bad_one(tmp_path):
    import datasets

    rows = [{"prompt": "p1", "chosen": "c1", "rejected": "r1", "strength": 2.0},
            {"prompt": "p2", "chosen": "c2", "rejected": "r2", "strength": 1.5}]
    jsonl = tmp_path / "prefs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    expected = [PreferencePair("p1", "c1", "r1", strength=2.0), PreferencePair("p2", "c2", "r2", strength=1.5)]
    assert load_preference_file(jsonl) == expected
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    assert load_preference_file(tmp_path / "hf") == expected
    jsonl.write_text(json.dumps({**rows[0], "strength": "much"}) + "\n")
    with pytest.raises(PreferenceDataError, match="row 1: strength must be a number from 1"):
        load_preference_file(jsonl)


def test_a_missing_column_names_the_column(tmp_path):
    jsonl = tmp_path / "prefs.jsonl"
    jsonl.write_text(json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
    with pytest.raises(PreferenceDataError, match="row 1 has no column 'rejected'"):
        load_preference_file(jsonl)


# ---- training ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """The tiny random model trained on the marker preference; the progress reports it sent."""
    reports = []
    config = RewardTrainConfig(
        model=str(tiny_model_dir), out_dir=str(tmp_path_factory.mktemp("rm") / "reward"), learning_rate=3e-3,
        epochs=6, batch_size=8, heldout_fraction=0.25, seed=0, show_progress=False,
    )
    result = train_reward_model(marker_pairs(120, seed=0), config, on_progress=reports.append)
    return result, reports


def test_a_tiny_model_learns_a_marker_word_preference_on_held_out_pairs(trained):
    result, _ = trained
    assert result.metrics["rm/n_heldout"] == 16 and result.metrics["rm/n_train"] == 104  # 2 of 15 prompts
    assert result.heldout_accuracy > 0.9
    assert result.metrics["rm/heldout_chosen_mean"] > result.metrics["rm/heldout_rejected_mean"]


def test_training_reports_progress_after_every_optimizer_step(trained):
    result, reports = trained
    steps = [r["rm/step"] for r in reports if "rm/step" in r]
    assert steps == sorted(steps) and steps[-1] == result.metrics["rm/steps"] == 6 * 13  # 104 pairs / 8 = 13 batches
    assert {"rm/loss", "rm/accuracy", "rm/chosen_mean", "rm/rejected_mean", "rm/lr"} <= set(reports[0])
    assert reports[-1]["rm/loss"] < reports[0]["rm/loss"]


def test_the_trained_model_is_saved_and_scores_the_same_after_loading(trained, tokenizer):
    result, _ = trained
    pairs = tokenize_pairs(tokenizer, marker_pairs(4, seed=9), max_length=128)
    batch = PairCollator(tokenizer.pad_token_id)(pairs)
    loaded = RewardModel.from_pretrained(result.path).eval()
    result.model.eval()
    with torch.no_grad():
        expected = result.model.forward_value(batch["input_ids"], batch["attention_mask"]).scores
        got = loaded.forward_value(batch["input_ids"], batch["attention_mask"]).scores
    assert torch.equal(expected, got)
    marker = json.loads((result.path / "reward_model.json").read_text())
    assert marker["info"]["training"]["metrics"]["rm/heldout_accuracy"] == result.heldout_accuracy


def test_warm_start_continues_from_the_saved_reward_model(trained):
    result, _ = trained
    # a learning rate of 0 leaves the weights as loaded: the warm-started model is exactly the saved one
    config = RewardTrainConfig(model="unused-when-warm-starting", warm_start=str(result.path), learning_rate=0.0,
                               epochs=1, heldout_fraction=0.25, seed=0, show_progress=False)
    again = train_reward_model(marker_pairs(120, seed=0), config)
    assert again.heldout_accuracy == result.heldout_accuracy
    assert again.metrics["rm/heldout_loss"] == pytest.approx(result.metrics["rm/heldout_loss"], abs=1e-6)


@pytest.mark.parametrize("grad_accum, epochs, max_steps, share_prompt, expected_steps", [
    (5, 2, None, False, 6),  # 90 pairs / 8 = 12 passes -> windows of 5, 5, 2 -> 3 steps an epoch
    (1, 2, 4, True, 4),  # max_steps stops the run early (and shared prompts train too)
])
def test_optimizer_steps_count_accumulation_windows(tiny_model_dir, grad_accum, epochs, max_steps, share_prompt,
                                                    expected_steps):
    config = RewardTrainConfig(model=str(tiny_model_dir), batch_size=8, grad_accum=grad_accum, epochs=epochs,
                               max_steps=max_steps, share_prompt=share_prompt, heldout_fraction=0.0,
                               show_progress=False)
    result = train_reward_model(marker_pairs(90, seed=0), config)
    assert result.metrics["rm/steps"] == expected_steps
    assert result.heldout_accuracy is None and result.path is None


def test_held_out_accuracy_of_versus_and_chosen_pairs_is_reported_apart_from_the_sample_pairs(tiny_model_dir,
                                                                                                tokenizer):
    from dataclasses import replace

    sources = {"Tell me about the paper.": "versus", "Tell me about the window.": "chosen"}  # "table": sample
    pairs = [replace(p, source=sources.get(p.prompt)) for p in marker_pairs(60, seed=0)]
    config = RewardTrainConfig(model=str(tiny_model_dir), learning_rate=0.0, max_steps=1, heldout_fraction=0.3,
                               show_progress=False)
    result = train_reward_model(pairs, config)
    held = (*sources, "Tell me about the table.")  # the prompts placed under 0.3
    groups = {source: [p for p in pairs if p.prompt in held and sources.get(p.prompt, "sample") == source]
              for source in ("sample", "versus", "chosen")}
    assert {k: result.metrics[k] for k in ("rm/n_train", "rm/n_heldout", "rm/n_heldout_sample", "rm/n_heldout_versus",
                                           "rm/n_heldout_chosen")} == {
        "rm/n_train": 49, "rm/n_heldout": 11, "rm/n_heldout_sample": 2, "rm/n_heldout_versus": 4,
        "rm/n_heldout_chosen": 5}
    model = result.model.eval()
    for source, name in (("sample", "rm/heldout_accuracy"), ("versus", "rm/heldout_accuracy_versus"),
                         ("chosen", "rm/heldout_accuracy_chosen")):
        batch = PairCollator(tokenizer.pad_token_id)(tokenize_pairs(tokenizer, groups[source], config.max_length))
        with torch.no_grad():
            scores = model.forward_value(batch["input_ids"], batch["attention_mask"]).scores  # (2n,)
        n = len(groups[source])
        assert result.metrics[name] == pytest.approx(float((scores[:n] > scores[n:]).float().mean())), source
    assert result.heldout_accuracy == result.metrics["rm/heldout_accuracy"]  # the sample pairs' accuracy


def test_too_few_pairs_is_an_error_before_any_model_is_loaded():
    config = RewardTrainConfig(model="/no/such/model", min_pairs=8)
    with pytest.raises(PreferenceDataError, match="Only 5 preference pairs.*at least 8"):
        train_reward_model(marker_pairs(5, seed=0), config)


# ---- the command ---------------------------------------------------------------------------------


def write_jsonl(path, pairs):
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                            for p in pairs))
    return path


def test_command_trains_from_a_file_saves_and_prints_held_out_accuracy(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "prefs.jsonl", marker_pairs(24, seed=1))
    code = app.main(["--train-reward", "--data", str(data), "--model", str(tiny_model_dir), "--out",
                     str(tmp_path / "rm"), "--rm-lr", "3e-3", "--rm-heldout-fraction", "0.25"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Held-out accuracy:" in out and "on 6 pairs (trained on 18" in out
    assert is_reward_model_dir(tmp_path / "rm")


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "p", "chosen": "c", "answer": "r"}] * 20, "no column 'rejected'"),
    ([{"prompt": "p", "chosen": "c", "rejected": "r"}] * 3, "Only 3 preference pairs"),
])
def test_command_errors_are_a_message_and_exit_code_not_a_traceback(tiny_model_dir, tmp_path, capsys, rows, message):
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--train-reward", "--data", str(data), "--model", str(tiny_model_dir), "--out", str(tmp_path / "rm")]
    code = app.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "rm").exists()


def test_command_without_votes_or_data_says_where_to_get_them(tmp_path, capsys):
    code = app.main(["--train-reward", "--db", str(tmp_path / "missing.db")])
    assert code == 2
    assert "No database at" in capsys.readouterr().err


def store_with_votes(db, pairs, tie_pairs=0):
    """A database where each pair's chosen answer (gen_a) won one vote; `tie_pairs` extra pairs got a tie."""
    from annotate.records import NewGeneration, NewPair
    from annotate.store import Store

    store = Store(db)
    store.add_prompts(sorted({p.prompt for p in pairs}), source="test")
    prompt_ids = {prompt.text: prompt.id for prompt in store.prompts()}
    policy = store.add_policy(0, "base")
    new_pairs = [NewPair(prompt_ids[p.prompt], NewGeneration(policy, p.chosen, 5, "stop"),
                         NewGeneration(policy, p.rejected, 5, "stop"), "sample") for p in pairs]
    for index, pair_id in enumerate(store.add_pairs_bulk(new_pairs)):
        store.record_vote(pair_id, "ann", "tie" if index < tie_pairs else "a", a_on_left=index % 2 == 0)
    store.close()


def test_command_trains_on_the_majority_votes_of_the_store(tiny_model_dir, tmp_path, capsys):
    db = tmp_path / "votes.db"
    store_with_votes(db, marker_pairs(22, seed=2), tie_pairs=2)  # ties are not preferences
    code = app.main(["--train-reward", "--db", str(db), "--model", str(tiny_model_dir), "--out", str(tmp_path / "rm")])
    captured = capsys.readouterr()
    assert code == 0
    assert "on 20 preference pairs" in captured.err
    assert "on 2 pairs (trained on 18" in captured.out


def test_command_with_too_few_votes_asks_for_more(tiny_model_dir, tmp_path, capsys):
    db = tmp_path / "votes.db"
    store_with_votes(db, marker_pairs(3, seed=2))
    assert app.main(["--train-reward", "--db", str(db), "--model", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert "Only 3 preference pairs" in err and "Collect more votes" in err
