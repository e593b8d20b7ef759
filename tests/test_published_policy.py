"""A saved policy is a folder a user can publish: safetensors weights, the tokenizer with its chat template, a
generation_config.json of PPO's own sampling settings, and a model card naming base model, round, votes and metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from annotate.store import Store
from loop.config_files import load_config
from rlhf.ppo.config import PPOConfig, rollout_sampling
from loop.model_card import model_card
from rlhf.reward.model import RewardModel
from loop.round_plan import RoundPlan
from loop.round import RoundRun, _ppo_stage

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello there", "what is two plus two", "tell me a joke", "name a colour"]


def test_model_card_names_base_model_round_votes_and_metrics():
    card = model_card("Qwen/Qwen2.5-0.5B-Instruct", round_number=3, n_votes=412, n_pairs=301,
                      metrics={"rm/heldout_accuracy": 0.7125, "ppo/kl": 0.01234, "ppo/score": 1.5, "history": [{}],
                               "round/stage": "ppo", "rm/n_heldout": 40, "round/normalize_rewards": True},
                      sampling=rollout_sampling())
    assert card.startswith("---\nbase_model: Qwen/Qwen2.5-0.5B-Instruct\n")
    assert "# Policy of round 3" in card
    assert "- **Base model:** `Qwen/Qwen2.5-0.5B-Instruct`" in card
    assert "- **Learned from:** 301 preference pairs, from 412 votes" in card
    assert "| `rm/heldout_accuracy` | 0.7125 |" in card and "| `ppo/kl` | 0.01234 |" in card
    assert "| `rm/n_heldout` | 40 |" in card
    assert "history" not in card and "round/stage" not in card  # only the reward model's and PPO's numbers
    assert "temperature 0.7, no top-k, no top-p" in card


def test_a_repetition_penalty_ppo_sampled_with_is_stated_and_none_is_added_without_one(tokenizer):
    from rlhf.decode import EndTokens
    from rlhf.ppo.experience import policy_generation_config

    ends = EndTokens((tokenizer.eos_token_id,), tokenizer.pad_token_id)
    penalised = policy_generation_config(tokenizer, rollout_sampling(repetition_penalty=1.2), ends).to_diff_dict()
    plain = policy_generation_config(tokenizer, rollout_sampling(), ends).to_diff_dict()
    assert penalised["repetition_penalty"] == 1.2 and "repetition_penalty" not in plain
    card = model_card("base", sampling=rollout_sampling(repetition_penalty=1.2))
    assert "temperature 0.7, no top-k, no top-p, repetition penalty 1.2 on the answer's tokens" in card


def test_model_card_puts_only_a_hub_id_in_the_metadata():
    card = model_card("data/models/SmolLM2-135M-Instruct")  # a local folder would fail the Hub's metadata check
    assert "base_model:" not in card and "`data/models/SmolLM2-135M-Instruct`" in card
    assert "# PPO policy" in card and "Round" not in card and "Learned from" not in card


@pytest.fixture(scope="module")
def shipping_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with a generation_config.json like Qwen2.5-Instruct's (repetition penalty, top-k, top-p)."""
    out = tmp_path_factory.mktemp("shipping-model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    config = json.loads((out / "generation_config.json").read_text())
    config.update(do_sample=True, repetition_penalty=1.1, temperature=0.7, top_k=20, top_p=0.8)
    (out / "generation_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    from rlhf.models import load_tokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("reward-model")
    return RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(out, tokenizer=load_tokenizer(tiny_model_dir))


def assert_publishable(folder: Path) -> str:
    """The folder's files, and that transformers alone loads it and chats with it; returns the model card."""
    assert (folder / "model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    shipped = json.loads((folder / "generation_config.json").read_text())
    assert "repetition_penalty" not in shipped and "min_new_tokens" not in shipped
    assert (shipped["do_sample"], shipped["temperature"], shipped["top_k"], shipped["top_p"]) == (True, 0.7, 0, 1.0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    torch.manual_seed(0)
    written = model.generate(**inputs, max_new_tokens=4)[0, inputs["input_ids"].shape[1]:]
    assert 1 <= len(written) <= 4
    return (folder / "README.md").read_text(encoding="utf-8")


def test_train_ppo_saves_a_folder_a_user_can_publish(shipping_model_dir, reward_model_dir, tmp_path):
    from loop.config import LoopConfig
    from loop.stages import train_ppo_with_card

    config = LoopConfig()
    config.app.model = str(shipping_model_dir)
    ppo = PPOConfig(batch_size=2, mini_batch_size=2, steps=1, sampling=rollout_sampling(max_new_tokens=4))
    result = train_ppo_with_card(config, str(reward_model_dir), PROMPTS, ppo, tmp_path / "actor")
    card = assert_publishable(result.saved_path)
    assert f"- **Base model:** `{shipping_model_dir}`" in card
    assert f"- **Reward model:** `{reward_model_dir}`" in card
    assert "| `ppo/score` |" in card and "| `ppo/kl` |" in card
    assert "- **PPO, over its steps:** mean reward (score - KL) " in card and "KL to the reference" in card
    assert "Round" not in card  # --train-ppo knows no round and no votes


def test_a_rounds_policy_folder_carries_the_rounds_card(tiny_model_dir, reward_model_dir, tmp_path):
    store = Store(tmp_path / "loop.db")
    base = store.ensure_base_policy(str(tiny_model_dir))
    store.add_prompts(PROMPTS)
    prompt_id = store.prompts()[0].id
    pair_id = store.add_pair(prompt_id, store.add_generation(prompt_id, base.id, "Hi!", 2, "stop"),
                             store.add_generation(prompt_id, base.id, "Hello there, friend.", 5, "stop"))
    for annotator, choice in (("ann", "b"), ("bob", "b"), ("cy", "tie")):
        store.record_vote(pair_id, annotator, choice, a_on_left=True)
    round_id = store.start_round(pid=1)
    store.update_round_metrics(round_id, {"rm/heldout_accuracy": 0.8125, "round/stage": "reward"})
    config = load_config(None, ["ppo.steps=1", "ppo.batch_size=2", "ppo.mini_batch_size=2",
                                 "ppo.sampling.max_new_tokens=4"])
    plan = RoundPlan(round_id=round_id, policy_round=1, preferences=list(store.preferences()),
                     new_pairs=1, reference_path=str(tiny_model_dir), actor_path=str(tiny_model_dir),
                     actor_policy_id=base.id, reward_warm_start=None, ppo_prompts=PROMPTS[:2],
                     out_dir=str(tmp_path / "round-1"))
    policy_id = _ppo_stage(RoundRun(plan, config, store, log=lambda message: None), str(reward_model_dir))
    folder = Path(store.policy(policy_id).path)
    card = assert_publishable(folder)
    assert "# Policy of round 1" in card and f"`{tiny_model_dir}`" in card
    assert "- **Learned from:** 1 preference pair, from 3 votes" in card
    assert "| `rm/heldout_accuracy` | 0.8125 |" in card and "| `ppo/score` |" in card
    assert "- **Reward model, held-out accuracy (random sample pairs):** 81.2%" in card
    store.close()
