import pytest
import torch

from rlhf.models import (
    ModelNotFoundError,
    format_prompt,
    load_causal_lm,
    load_tokenizer,
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
