import pytest
import torch

from rlhf.folders import written_atomically
from rlhf.models import (
    ModelNotFoundError,
    ModelSetupError,
    end_of_turn_token,
    format_prompt,
    load_causal_lm,
    load_tokenizer,
    prepare_tokenizer,
    resolve_model_path,
)


def test_tiny_model_loads_and_runs_a_forward_pass(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    batch = tokenizer(["hello there", "a longer prompt than the first"], return_tensors="pt", padding=True)
    with torch.inference_mode():
        logits = model(**batch).logits
    assert logits.shape == (2, batch.input_ids.shape[1], len(tokenizer))


def test_tokenizer_pads_left_with_an_explicit_pad_token(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token is not None
    batch = tokenizer(["hi", "hello there friend"], padding=True)
    assert batch["attention_mask"][0][0] == 0  # the short one is padded on the left
    assert batch["attention_mask"][0][-1] == 1


def test_format_prompt_uses_the_chat_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    text = format_prompt(tokenizer, "Name a fruit.")
    assert "Name a fruit." in text
    assert text.rstrip().endswith("assistant")


def test_a_missing_local_folder_says_so(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))


def test_a_folder_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path))


def test_hub_ids_pass_through_unchanged():
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


# ---- folders written atomically ---------------------------------------------------------------------------------


def test_a_folder_written_atomically_appears_whole_and_replaces_the_old_one(tmp_path):
    target = tmp_path / "model"
    for version in ("one", "two"):
        with written_atomically(target) as staging:
            assert staging.parent == tmp_path and staging.name.startswith(".model-")  # beside it: one file system
            (staging / "weights").write_text(version)
            (staging / "config").write_text(version)
            # until the block ends the real name holds nothing new: nothing at first, then the old folder whole
            assert not target.exists() if version == "one" else (target / "weights").read_text() == "one"
        assert sorted(p.name for p in target.iterdir()) == ["config", "weights"]
        assert (target / "weights").read_text() == version
        assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging folder, no old folder left


def test_an_error_while_writing_leaves_the_old_folder_untouched_and_no_staging_folder(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(RuntimeError, match="disk full"):
        with written_atomically(target) as staging:
            (staging / "weights").write_text("half")
            raise RuntimeError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in target.iterdir()] == ["weights"] and (target / "weights").read_text() == "old"


def test_keep_existing_keeps_a_folder_another_process_finished_first(tmp_path):
    target = tmp_path / "model"
    with written_atomically(target, keep_existing=True) as staging:
        (staging / "weights").write_text("mine")
        target.mkdir()
        (target / "weights").write_text("theirs")
    assert (target / "weights").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.slow
def test_default_model_generates_an_answer_to_a_shipped_prompt():
    import json
    from pathlib import Path

    prompt = json.loads(Path("data/prompts.jsonl").read_text().splitlines()[0])["prompt"] \
        if Path("data/prompts.jsonl").exists() else "Give me one tip for sleeping better."
    tokenizer = load_tokenizer("default")
    model = load_causal_lm("default")
    batch = tokenizer([format_prompt(tokenizer, prompt)], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(out[0, batch.input_ids.shape[1]:], skip_special_tokens=True)
    assert answer.strip()


# ---- a model the loop cannot use as shipped: fixed or refused before any work starts ---------------------------


def test_end_of_turn_token_is_read_from_the_chat_template(real_tokenizer):
    import copy

    assert end_of_turn_token(real_tokenizer) == "<|im_end|>"  # SmolLM2's EOS already: nothing to change
    plain = copy.deepcopy(real_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}"
    assert end_of_turn_token(plain) is None  # a turn that ends with plain text has no token to stop at
    plain.chat_template = None
    assert end_of_turn_token(plain) is None


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_says_so_once(tmp_path, real_tokenizer, capsys):
    from rlhf.tiny_models import build_family_model

    folder = build_family_model("mistral", tmp_path / "mistral", real_tokenizer)  # Mistral ships no pad token
    tokenizers = [load_tokenizer(folder), load_tokenizer(folder)]
    model = load_causal_lm(folder)
    assert all(t.pad_token == t.eos_token == "</s>" for t in tokenizers)
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tokenizers[0].eos_token_id
    assert capsys.readouterr().err.count("no pad token; padding with the EOS </s>") == 1


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(tmp_path, real_tokenizer):
    from rlhf.tiny_models import build_family_model

    # the Llama 3 tokenizer adds 5 special tokens to SmolLM2's 49152; a model embedding only 49152 cannot read them
    folder = build_family_model("llama", tmp_path / "llama", real_tokenizer, vocab_size=49152)
    with pytest.raises(ModelSetupError, match=r"49157 tokens but the model embeds only 49152.*resize_token_embeddings"):
        load_causal_lm(folder)


def test_a_tokenizer_with_no_eos_and_no_chat_template_is_refused(real_tokenizer):
    import copy

    tokenizer = copy.deepcopy(real_tokenizer)
    tokenizer.chat_template, tokenizer.eos_token = None, None
    with pytest.raises(ModelSetupError, match="nothing tells where an answer ends"):
        prepare_tokenizer(tokenizer, "bare")


@pytest.fixture(scope="module")
def short_context_dir(tmp_path_factory, real_tokenizer):
    """A tiny GPT-2 with a 64-token context: its positions are learned, so a position past 63 crashes (a RoPE model
    only degrades), which shows whether a long prompt is cut."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(real_tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        bos_token_id=real_tokenizer.bos_token_id, eos_token_id=real_tokenizer.eos_token_id)
    out = tmp_path_factory.mktemp("gpt2-64")
    GPT2LMHeadModel(config).save_pretrained(out)
    real_tokenizer.save_pretrained(out)
    return out


LONG_PROMPT = "Tell me about " + " and ".join(f"thing {i}" for i in range(60)) + "."


def test_a_prompt_longer_than_the_context_loses_its_start_instead_of_crashing(short_context_dir, capsys):
    from rlhf.generate import encode_prompt, generate_answers
    from rlhf.sampling import Sampling

    tokenizer, model = load_tokenizer(short_context_dir), load_causal_lm(short_context_dir)
    ids = torch.tensor([encode_prompt(tokenizer, LONG_PROMPT)])
    assert ids.shape[1] > 64
    with pytest.raises(IndexError):  # what a round would meet without the cut
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4)
    sampling = Sampling(max_new_tokens=8, temperature=1.0)
    answer = generate_answers(model, tokenizer, [LONG_PROMPT, "Hi"], n_per_prompt=1, sampling=sampling,
                              seed=0).answers[0][0]
    assert 0 < answer.n_tokens <= 8
    assert "1 of 2 prompts are longer than the 56 tokens the model's context leaves them" in capsys.readouterr().err


def test_max_new_tokens_that_leave_no_room_for_a_prompt_are_refused_before_generating(short_context_dir):
    from rlhf.generate import generate_answers
    from rlhf.sampling import Sampling

    tokenizer, model = load_tokenizer(short_context_dir), load_causal_lm(short_context_dir)
    with pytest.raises(ModelSetupError, match="context holds 64 tokens: max_new_tokens = 40 leaves 24 for the prompt"
                                              ".*at most 32"):
        generate_answers(model, tokenizer, ["Hi"], sampling=Sampling(max_new_tokens=40))


def test_ppo_cuts_prompts_to_what_the_context_leaves_and_runs_on_them(short_context_dir, real_tokenizer, tmp_path):
    from transformers import AutoConfig

    from rlhf.ppo.config import PPOConfig, rollout_sampling
    from rlhf.ppo.train import fit_prompt_length, train_ppo
    from rlhf.reward.model import RewardModel

    model_config = AutoConfig.from_pretrained(short_context_dir)
    eight = rollout_sampling(max_new_tokens=8)
    assert fit_prompt_length(PPOConfig(sampling=eight), model_config).max_prompt_length == 56
    assert fit_prompt_length(PPOConfig(sampling=eight, max_prompt_length=20), model_config).max_prompt_length == 20
    with pytest.raises(ModelSetupError, match=r"\[ppo.sampling\] max_new_tokens = 40"):
        fit_prompt_length(PPOConfig(sampling=rollout_sampling(max_new_tokens=40)), model_config)
    reward_dir = RewardModel.from_causal_lm(short_context_dir).save_pretrained(tmp_path / "rm", real_tokenizer)
    config = PPOConfig(batch_size=2, mini_batch_size=2, steps=1, sampling=eight)
    result = train_ppo(short_context_dir, reward_dir, [LONG_PROMPT, "Hi"], config, tmp_path / "actor")
    assert result.config["max_prompt_length"] == 56
    assert torch.isfinite(torch.tensor(result.history[-1]["ppo/kl"]))


def test_sft_cuts_examples_to_the_context(short_context_dir, tmp_path):
    from rlhf.sft.config import SFTConfig
    from rlhf.sft.train import train_sft

    result = train_sft(short_context_dir, [(LONG_PROMPT, "Thing one is " + "very " * 40 + "nice.")],
                       SFTConfig(epochs=1, batch_size=1), tmp_path / "sft", show_bar=False)
    assert result.truncated == 1 and torch.isfinite(torch.tensor(result.losses)).all()


@pytest.mark.parametrize("setting, message", [
    ([], r"\[sampling\] max_new_tokens = 512 leaves 0 for the prompt"),
    (["sampling.max_new_tokens=8", "ppo.sampling.max_new_tokens=60"], r"\[ppo.sampling\] max_new_tokens = 60 leaves 4"),
    (["sampling.max_new_tokens=8", "ppo.sampling.max_new_tokens=8"], r"\[reward\] max_length = 512 is longer"),
])
def test_a_round_the_context_cannot_hold_is_refused_before_it_touches_the_database(short_context_dir, tmp_path,
                                                                                   capsys, setting, message):
    import re

    import app

    db = tmp_path / "data" / "loop.db"
    for command in ("--train-round", "--demo-loop"):
        arguments = [command, "--model", str(short_context_dir), "--db", str(db)]
        assert app.main(arguments + [arg for s in setting for arg in ("--set", s)]) == 2
        assert re.search(message, capsys.readouterr().err)
        assert not db.parent.exists()
