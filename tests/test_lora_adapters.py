"""LoRA policies saved as adapters (peft's format) on the base model: loaded merged wherever a policy loads, chained
on the base round after round, merged into a whole model by `--merge`, and kept with the folder they sit on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import app
from annotate.store import Store
from loop.config_files import load_config
from loop.round import run_round
from rlhf.models import ModelNotFoundError, adapter_base, is_adapter_folder, load_causal_lm, load_tokenizer
from rlhf.ppo import train as ppo_train
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.reward.model import RewardModel
from tests.test_round import seed_votes, tiny_settings

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello there", "what is two plus two", "tell me a joke", "name a colour"]
IDS = torch.tensor([[1, 17, 230, 4096, 9, 2]])


def lora_config(**overrides) -> PPOConfig:
    # fp32: logits compared to 1e-5; a large adapter learning rate so that one step moves them visibly
    settings = dict(batch_size=2, mini_batch_size=2, steps=1, seed=0, use_lora=True, lora_lr=5e-2,
                    mixed_precision="no", sampling=rollout_sampling(max_new_tokens=4))
    return PPOConfig(**{**settings, **overrides})


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits  # (1, L, V)


def train_and_keep_trainer(*args, **kwargs):
    """rlhf.ppo.train.train_ppo, also handing back the trainer it built (its actor as trained)."""
    built = []
    real = ppo_train.build_ppo_trainer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ppo_train, "build_ppo_trainer", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
        result = ppo_train.train_ppo(*args, **kwargs)
    return result, built[0]


@pytest.fixture(scope="module")
def reward_dir(tiny_model_dir, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("lora-rm") / "rm"
    return RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(out, tokenizer=load_tokenizer(tiny_model_dir))


@pytest.fixture(scope="module")
def first_run(tiny_model_dir, reward_dir, tmp_path_factory):
    """A LoRA PPO run from the tiny base model: (its saved folder, the merge the old code saved, from the trainer)."""
    import copy

    out = tmp_path_factory.mktemp("lora-run") / "policy-1"
    result, trainer = train_and_keep_trainer(tiny_model_dir, reward_dir, PROMPTS[:2], lora_config(), out)
    old_merge = copy.deepcopy(trainer.unwrapped_actor()).merge_and_unload()
    return result.saved_path, logits(old_merge)


def test_a_lora_run_saves_adapters_on_the_base_that_load_as_the_merged_model(first_run, tiny_model_dir):
    folder, merged_logits = first_run
    files = {path.name for path in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    assert "model.safetensors" not in files and "config.json" not in files
    assert is_adapter_folder(folder) and adapter_base(folder) == str(tiny_model_dir)
    assert json.loads((folder / "generation_config.json").read_text())["temperature"] == 0.7  # PPO's sampling
    loaded = load_causal_lm(folder)
    assert not hasattr(loaded, "peft_config")  # merged: a plain model, as fast to generate with as a whole one
    torch.testing.assert_close(logits(loaded), merged_logits, rtol=0, atol=1e-5)
    assert not torch.allclose(merged_logits, logits(load_causal_lm(tiny_model_dir)), atol=1e-3)  # it trained


def test_a_second_lora_run_trains_the_same_adapters_on_the_base(first_run, tiny_model_dir, reward_dir, tmp_path):
    folder, merged_logits = first_run
    trainer = ppo_train.build_ppo_trainer(folder, reward_dir, lora_config(), reference_path=tiny_model_dir)
    actor = trainer.unwrapped_actor()
    assert trainer.reference is None  # the reference is the base: the actor with its adapters disabled
    torch.testing.assert_close(logits(actor), merged_logits, rtol=0, atol=1e-5)  # the saved adapters, trainable
    assert any(p.requires_grad for name, p in actor.named_parameters() if "lora_" in name)
    with actor.disable_adapter():
        torch.testing.assert_close(logits(actor), logits(load_causal_lm(tiny_model_dir)), rtol=0, atol=1e-5)

    result = ppo_train.train_ppo(folder, reward_dir, PROMPTS[2:], lora_config(), tmp_path / "policy-2",
                                 reference_path=tiny_model_dir)
    second = result.saved_path
    assert adapter_base(second) == str(tiny_model_dir)  # still the base, never the first policy
    first_config = json.loads((folder / "adapter_config.json").read_text())
    second_config = json.loads((second / "adapter_config.json").read_text())
    # peft keeps target_modules as a set and writes it in hash order, which differs between processes
    assert sorted(second_config["target_modules"]) == sorted(first_config["target_modules"])
    assert not torch.allclose(logits(load_causal_lm(second)), merged_logits, atol=1e-4)  # trained on


def test_the_default_reference_of_an_adapter_actor_is_the_actor_as_it_starts(first_run, reward_dir):
    folder, merged_logits = first_run
    trainer = ppo_train.build_ppo_trainer(folder, reward_dir, lora_config())
    assert trainer.reference is not None  # not the base: the policy the adapters make, loaded merged
    torch.testing.assert_close(logits(trainer.reference), merged_logits, rtol=0, atol=1e-5)


def test_without_lora_an_adapter_policy_loads_merged_and_trains_in_full(first_run, reward_dir, tmp_path):
    folder, merged_logits = first_run
    trainer = ppo_train.build_ppo_trainer(folder, reward_dir, lora_config(use_lora=False))
    assert not hasattr(trainer.unwrapped_actor(), "peft_config")
    torch.testing.assert_close(logits(trainer.unwrapped_actor()), merged_logits, rtol=0, atol=1e-5)
    saved = trainer.save_actor(tmp_path / "full")
    assert (saved / "model.safetensors").is_file() and not is_adapter_folder(saved)


def test_an_adapter_whose_base_is_gone_says_where_it_looked_and_what_to_do(first_run, tmp_path):
    folder = Path(shutil.copytree(first_run[0], tmp_path / "moved"))
    recorded = json.loads((folder / "adapter_config.json").read_text())
    recorded["base_model_name_or_path"] = str(tmp_path / "gone-base")
    (folder / "adapter_config.json").write_text(json.dumps(recorded))
    with pytest.raises(ModelNotFoundError) as error:
        load_causal_lm(folder)
    message = str(error.value)
    assert f"LoRA adapters on the base model {tmp_path / 'gone-base'}" in message
    assert "base_model_name_or_path" in message and "adapter_config.json" in message


def test_merge_writes_a_whole_model_that_transformers_loads_alone(first_run, tiny_model_dir, tmp_path, capsys):
    folder, merged_logits = first_run
    assert app.main(["--merge", str(folder), str(tmp_path / "merged")]) == 0
    assert "a whole model in" in capsys.readouterr().out
    merged = tmp_path / "merged"
    assert (merged / "model.safetensors").is_file() and (merged / "generation_config.json").is_file()
    assert (merged / "tokenizer.json").is_file() and not is_adapter_folder(merged)
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(merged)), merged_logits, rtol=0, atol=1e-5)

    db = tmp_path / "loop.db"  # a policy id of --db names its folder
    with Store(db) as store:
        store.ensure_base_policy(str(tiny_model_dir))
        policy_id = store.add_policy(1, str(folder), parent_id=1)
    assert app.main(["--merge", str(policy_id), str(tmp_path / "by-id"), "--db", str(db)]) == 0
    assert (tmp_path / "by-id" / "model.safetensors").is_file()


def test_merge_refuses_a_whole_model_and_an_existing_out(first_run, tiny_model_dir, tmp_path, capsys):
    assert app.main(["--merge", str(tiny_model_dir), str(tmp_path / "out")]) == 2
    assert "holds a whole model, not LoRA adapters: there is nothing to merge" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    assert app.main(["--merge", str(first_run[0]), str(tmp_path / "taken")]) == 2
    assert "exists" in capsys.readouterr().err


def test_a_lora_round_saves_an_adapter_policy_and_makes_the_next_pairs_from_it(tmp_path, tiny_model_dir):
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["ppo.use_lora=true"])
    result = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    store = Store(db)
    folder = Path(store.policy(result.policy_id).path)
    assert is_adapter_folder(folder) and adapter_base(folder) == str(tiny_model_dir)
    assert not (folder / "model.safetensors").exists()
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "library_name: peft" in card and f"- **LoRA adapters on:** `{tiny_model_dir}`" in card
    assert "python app.py --merge PATH OUT" in card and "# Policy of round 1" in card
    assert result.metrics["round/pairs_generated"] >= 1
    made_by = {store.generation(store.pair(pid).gen_a).policy_id for pid in range(1, store.count_pairs() + 1)}
    assert result.policy_id in made_by  # the next pairs were generated from the adapter policy
    store.close()


def test_retention_keeps_the_policy_folder_a_kept_policys_adapters_sit_on(tmp_path):
    from annotate.disk import POLICY, REWARD_MODEL, Checkpoint, folder_key, named_checkpoints
    from loop.retention import adapter_bases, retention_plan
    from tests.test_retention import ROOT, decisions_by_label, five_rounds_and_a_crash

    policies, rounds, win_rates = five_rounds_and_a_crash()
    checkpoints = named_checkpoints(policies, rounds, ROOT)
    # LoRA turned on after round 1's full fine-tuning: policy 6's adapters (round 5) sit on policy 2's folder
    bases = {folder_key(ROOT / "round-5" / "policy"): folder_key(ROOT / "round-1" / "policy")}
    got = decisions_by_label(retention_plan(checkpoints, policies, rounds, win_rates, keep_policies=1, bases=bases))
    assert got["policy 2 (round-1/policy)"] == (True, "the LoRA adapters of kept policy 6 sit on it: they load on it")
    assert got["policy 4 (round-3/policy)"][0] is False  # nothing sits on it: deleted as before

    adapters, whole = tmp_path / "round-2" / "policy", tmp_path / "round-1" / "policy"
    adapters.mkdir(parents=True)
    (adapters / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(whole)}))
    on_disk = [Checkpoint(folder_key(adapters), POLICY, (2,), frozenset({3})),
               Checkpoint(folder_key(whole), POLICY, (1,), frozenset({2})),
               Checkpoint(folder_key(tmp_path / "round-2" / "reward"), REWARD_MODEL, (2,), frozenset({3}))]
    assert adapter_bases(on_disk) == {folder_key(adapters): folder_key(whole)}  # read from adapter_config.json
