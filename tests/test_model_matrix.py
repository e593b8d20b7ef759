"""The model matrix: a tiny random model of each architecture teams bring (rlhf.tiny_models: Llama 3, Qwen2, Gemma 3,
Phi-3, Mistral; Qwen2 and Gemma 3 with tied embeddings) loads with the stop and pad tokens its chat template needs,
and goes through SFT, reward training, PPO and a whole demo round."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import app
from rlhf.generate import encode_prompt, eos_token_ids, generate_answers, response_mask_until_eos
from rlhf.models import format_prompt, load_causal_lm, load_tokenizer
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.sampling import Sampling
from rlhf.ppo.train import train_ppo
from rlhf.reward.data import PreferencePair
from rlhf.reward.model import is_reward_model_dir
from rlhf.reward.train import RewardTrainConfig, train_reward_model
from rlhf.sft.config import SFTConfig
from rlhf.sft.train import encode_example, train_sft
from rlhf.tiny_models import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")

EXPECTED = {
    # family: (EOS once loaded = the template's end of turn, pad token, the shipped EOS, which must still stop)
    "llama": ("<|eot_id|>", "<|eot_id|>", "<|end_of_text|>"),
    "qwen2": ("<|im_end|>", "<|endoftext|>", "<|im_end|>"),
    "gemma3": ("<end_of_turn>", "<pad>", "<eos>"),
    "phi3": ("<|end|>", "<|endoftext|>", "<|endoftext|>"),
    "mistral": ("</s>", "</s>", "</s>"),
}
GENERATION_PROMPT_END = {
    "llama": "<|start_header_id|>assistant<|end_header_id|>\n\n", "qwen2": "<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>model\n", "phi3": "<|assistant|>\n", "mistral": "[/INST]",
}
WORDS = ["apple", "river", "stone", "cloud", "lamp", "garden", "violin", "harbour", "meadow", "candle", "bridge", "owl"]


def test_the_matrix_covers_the_families_teams_use():
    assert set(FAMILIES) == set(EXPECTED) == {"llama", "qwen2", "gemma3", "phi3", "mistral"}
    assert {name for name, family in FAMILIES.items() if family.tie_word_embeddings} == {"qwen2", "gemma3"}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_with_its_end_of_turn_as_eos_and_a_pad_token(family, family_dirs):
    eos, pad, shipped_eos = EXPECTED[family]
    tokenizer = load_tokenizer(family_dirs[family])
    model = load_causal_lm(family_dirs[family])

    assert (tokenizer.eos_token, tokenizer.pad_token) == (eos, pad)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    stop_ids = eos_token_ids(model, tokenizer)
    assert {tokenizer.convert_tokens_to_ids(eos), tokenizer.convert_tokens_to_ids(shipped_eos)} <= set(stop_ids)
    assert model.get_input_embeddings().num_embeddings >= len(tokenizer)
    assert format_prompt(tokenizer, "Name a fruit.").endswith(GENERATION_PROMPT_END[family])
    assert "Name a fruit." in tokenizer.decode(encode_prompt(tokenizer, "Name a fruit."))


@pytest.mark.parametrize("family", ["llama", "gemma3", "phi3"])
def test_as_shipped_these_families_would_not_stop_at_the_end_of_their_turn(family, family_dirs):
    """What the loaders fix: the folder's own tokenizer and generation config know only the shipped EOS."""
    raw_tokenizer = AutoTokenizer.from_pretrained(family_dirs[family])
    raw_model = AutoModelForCausalLM.from_pretrained(family_dirs[family])
    end_of_turn = raw_tokenizer.convert_tokens_to_ids(EXPECTED[family][0])
    assert end_of_turn not in eos_token_ids(raw_model, raw_tokenizer)


def _always_writing(model, token_id: int):
    """A forward hook that makes the LM head put all its weight on `token_id`: the model writes it at once."""
    def hook(module, inputs, logits):
        logits = logits.clone()
        logits[..., token_id] += 1e4
        return logits
    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("family", FAMILIES)
def test_answers_end_at_the_end_of_turn_and_at_the_shipped_eos(family, family_dirs):
    tokenizer, model = load_tokenizer(family_dirs[family]), load_causal_lm(family_dirs[family])
    greedy = Sampling(max_new_tokens=5, temperature=0.0)
    for token in set(EXPECTED[family][::2]):  # the end of turn and the shipped EOS
        token_id = tokenizer.convert_tokens_to_ids(token)
        handle = _always_writing(model, token_id)
        try:
            answer = generate_answers(model, tokenizer, ["Hi"], n_per_prompt=1, sampling=greedy).answers[0][0]
        finally:
            handle.remove()
        assert (answer.finish_reason, answer.n_tokens, answer.text) == ("stop", 0, ""), token
        # PPO finds the end of a response with the same ids: the action mask stops after the end-of-turn token
        mask, ended = response_mask_until_eos(torch.tensor([[11, token_id, 12]]), eos_token_ids(model, tokenizer))
        assert mask.tolist() == [[1, 1, 0]] and ended.tolist() == [True]


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_then_reward_model_then_ppo_on_each_family(family, family_dirs, tmp_path):
    base = family_dirs[family]
    tokenizer = load_tokenizer(base)
    # SFT: an answer ends with the end-of-turn token, as the chat template ends the assistant's turn
    examples = [(f"Name fruit number {i}.", f"Fruit {i} is an apple.") for i in range(4)]
    _, labels, _ = encode_example(tokenizer, *examples[0], max_length=64)
    assert labels[-1] == tokenizer.convert_tokens_to_ids(EXPECTED[family][0])
    sft = train_sft(base, examples, SFTConfig(epochs=1, batch_size=2, max_length=64), tmp_path / "sft",
                    show_bar=False)
    assert sft.steps == 2 and all(math.isfinite(loss) for loss in sft.losses)
    assert load_tokenizer(sft.out_dir).eos_token == EXPECTED[family][0]  # the saved policy keeps it

    # reward model on the SFT policy
    pairs = [PreferencePair(f"Tell me about the {word}.", f"The {word} is lovely, thank you for asking.",
                            f"{word}.") for word in WORDS]
    reward = train_reward_model(pairs, RewardTrainConfig(
        model=str(sft.out_dir), out_dir=str(tmp_path / "reward"), epochs=1, batch_size=4, heldout_fraction=0.25,
        min_pairs=4, max_length=64, show_progress=False))
    assert is_reward_model_dir(reward.path)
    assert reward.metrics["rm/n_train"] + reward.metrics["rm/n_heldout"] == len(pairs)
    assert math.isfinite(reward.metrics["rm/loss"])

    # PPO: actor and reference from the SFT policy, critic and reward model from the reward model
    config = PPOConfig(batch_size=2, mini_batch_size=2, steps=1, seed=0, sampling=rollout_sampling(max_new_tokens=6))
    result = train_ppo(sft.out_dir, reward.path, [f"Describe the {w}." for w in WORDS[:2]], config, tmp_path / "ppo")
    step = result.history[-1]
    assert step["ppo/step"] == 1
    for key in ("ppo/kl", "ppo/policy_loss", "ppo/value_loss", "ppo/score"):
        assert math.isfinite(step[key]), key
    policy = load_causal_lm(result.saved_path)
    assert type(policy).__name__ == type(load_causal_lm(base)).__name__
    assert load_tokenizer(result.saved_path).eos_token == EXPECTED[family][0]


def demo_loop_arguments(model_dir, tmp_path) -> list[str]:
    """One demo round of a tiny model in seconds: few votes, short answers, no accuracy bar."""
    settings = [
        "sampling.max_new_tokens=8", "pairs.batch_size=8", "ppo.sampling.max_new_tokens=8", "ppo.batch_size=4",
        "ppo.mini_batch_size=4", "ppo.steps=1", "round.ppo_prompts=4", "round.min_accuracy=0",
        "round.min_new_pairs=1", "round.next_pairs=2", f"round.checkpoints_dir={tmp_path / 'checkpoints'}",
        "reward.batch_size=4", "reward.max_length=96", "reward.min_pairs=1", "reward.heldout_fraction=0.25",
    ]
    return ["--demo-loop", "--rounds", "1", "--annotator", "longer", "--votes", "8", "--eval-prompts", "2",
            "--eval-answers", "1", "--db", str(tmp_path / "demo.db"), "--model", str(model_dir),
            *[arg for setting in settings for arg in ("--set", setting)]]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_demo_loop_runs_a_whole_round_on_each_family(family, family_dirs, tmp_path, capsys):
    code = app.main(demo_loop_arguments(family_dirs[family], tmp_path))
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert [row["round"] for row in result["rounds"]] == [1]
    assert math.isfinite(result["rounds"][0]["kl"])
    policy = tmp_path / "checkpoints" / "demo" / "round-1" / "policy"
    assert load_tokenizer(policy).eos_token == EXPECTED[family][0]
