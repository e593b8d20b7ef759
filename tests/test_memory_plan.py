"""The memory plan (rlhf.memory_plan, loop.memory, `--plan`): figures worked out by hand on a small shape, the counts
from a config on the meta device, the command, and a round refused before it loads anything."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

import app
from rlhf.memory_plan import PlanSettings, largest_batch, plan_engine, recommend
from rlhf.model_shape import ModelShape, shape_from_config

# 4 layers of 200 parameters, 200 in tied embeddings and the final norm: 1000 in all
SHAPE = ModelShape(name="hand", parameters=1000, embedding_parameters=200, layer_parameters=200, layers=4, hidden=8,
                   intermediate=16, kv_width=4, vocab=50, lora_per_rank=100)
SETTINGS = PlanSettings(batch_size=2, mini_batch_size=2, prompt_tokens=3, answer_tokens=2, reward_layers=2,
                        lora_rank=1)


def parts(plan) -> dict:
    return {m.role: (m.weights, m.gradients, m.optimizer) for m in plan.models}


def test_ddp_on_one_process_by_hand():
    plan = plan_engine(SHAPE, SETTINGS, "ddp")
    # critic and reward model: embeddings 200 + 2 layers x 200 + a value head of 8 = 608 parameters
    assert parts(plan) == {"actor": (4000, 0, 8000), "critic": (2432, 0, 4864), "reference": (4000, 0, 0),
                           "reward": (2432, 0, 0)}
    # 10 tokens (2 x (3 + 2)); per layer and token 6 x 8 + 2 x 4 + 4 x 16 = 120, plus 3 x 8 outside the layers:
    # actor 10 x (4 x 120 + 24) x 4 = 20160, critic 10 x (2 x 120 + 24) x 4 = 10560; logits 2 x 3 x 50 x 4 = 1200,
    # six of them; the actor's gradients 4 x 1000
    assert plan.training == 20160 + 10560 + 6 * 1200 + 4000
    # KV cache 2 x 4 layers x 10 tokens x 4 x 4 bytes, last logits 2 x 50 x 4
    assert plan.generation == 1280 + 400
    assert plan.resident == 25728 and plan.peak == 25728 + 41920


def test_lora_holds_each_base_once_and_trains_the_adapters():
    plan = plan_engine(SHAPE, SETTINGS, "lora")
    # rank 1: the actor's adapters 100 a layer x 4 = 400, the critic's 100 x 2 + its value head 8 = 208
    assert parts(plan) == {"actor": (4000 + 1600, 0, 3200), "critic": (2432 + 832, 0, 1664)}
    assert plan.training == 20160 + 10560 + 7200 + 1600
    assert plan.peak == 8800 + 4928 + 39520


def test_two_gpus_ddp_adds_buckets_and_fsdp2_shards():
    two = replace(SETTINGS, gpus=2)
    ddp = plan_engine(SHAPE, two, "ddp")
    assert parts(ddp)["actor"] == (4000, 4000, 8000) and parts(ddp)["critic"] == (2432, 2432, 4864)
    fsdp2 = plan_engine(SHAPE, two, "fsdp2")
    # every model halved, and the actor's whole plain copy that generates
    assert parts(fsdp2) == {"actor": (2000, 0, 4000), "critic": (1216, 0, 2432), "reference": (2000, 0, 0),
                            "reward": (1216, 0, 0), "actor copy": (4000, 0, 0)}
    # two gathered layers of 4 x 200 bytes, the actor's gradients halved
    assert fsdp2.training == 20160 + 10560 + 7200 + 2000 + 1600
    assert fsdp2.generation == 1280 + 400
    # LoRA's two models halved, bases and adapters, with the adapters' optimiser state; the copy whole, adapters too
    assert parts(plan_engine(SHAPE, two, "fsdp2-lora")) == {"actor": (2800, 0, 1600), "critic": (1632, 0, 832),
                                                            "actor copy": (5600, 0, 0)}


def test_bf16_halves_activations_and_adds_autocast_copies():
    plan = plan_engine(SHAPE, replace(SETTINGS, bf16=True), "ddp")
    # bf16 copies of the trained weights: 2 x (1000 + 608); the logits stay fp32
    assert plan.training == 10080 + 5280 + 7200 + 4000 + 3216
    assert plan.generation == 640 + 400 + 2000


def test_the_largest_batch_fits_and_one_more_does_not():
    memory = 1_000_000
    best = largest_batch(SHAPE, SETTINGS, "ddp", memory)
    at = lambda b: plan_engine(SHAPE, replace(SETTINGS, batch_size=b, mini_batch_size=b), "ddp")  # noqa: E731
    assert best > 1 and at(best).fits(memory) and not at(best + 1).fits(memory)
    assert largest_batch(SHAPE, SETTINGS, "ddp", 1000) == 0


def test_recommend_prefers_the_configured_kind_then_lora_then_a_smaller_batch():
    plans = {name: plan_engine(SHAPE, SETTINGS, name) for name in ("ddp", "lora", "fsdp2", "fsdp2-lora")}
    largest = {name: 1 for name in plans}
    roomy, between = 10 * plans["ddp"].peak, (plans["ddp"].peak + plans["lora"].peak) / 2 / 0.9
    assert recommend(plans, largest, roomy, use_lora=False)[0] == "ddp"
    assert recommend(plans, largest, roomy, use_lora=True)[0] == "lora"
    assert recommend(plans, largest, between, use_lora=False) == \
        ("lora", "full fine-tuning does not fit: set ppo.use_lora = true")
    assert recommend(plans, largest, 1000, use_lora=False) == \
        ("ddp", "batch 2 does not fit: set ppo.batch_size = 1 or less")
    assert recommend(plans, dict.fromkeys(plans, 0), 1000, use_lora=False)[0] is None
    # weights, not activations: one token each way on 8 GPUs, where sharding the trained models beats LoRA
    eight = replace(SETTINGS, gpus=8, batch_size=1, mini_batch_size=1, prompt_tokens=1, answer_tokens=1)
    two = {name: plan_engine(SHAPE, eight, name) for name in plans}
    only_fsdp2 = (two["fsdp2"].peak + min(two["lora"].peak, two["ddp"].peak)) / 2 / 0.9
    assert two["fsdp2"].peak < only_fsdp2 * 0.9 < min(two["lora"].peak, two["ddp"].peak)
    assert recommend(two, largest, only_fsdp2, use_lora=False) == \
        ("fsdp2", "DDP does not fit and LoRA neither: set ppo.engine = fsdp2")
    only_sharded_lora = (two["fsdp2-lora"].peak + min(two["lora"].peak, two["fsdp2"].peak)) / 2 / 0.9
    assert two["fsdp2-lora"].peak < only_sharded_lora * 0.9 < min(two["lora"].peak, two["fsdp2"].peak)
    assert recommend(two, largest, only_sharded_lora, use_lora=True) == \
        ("fsdp2-lora", "DDP does not fit, with LoRA or without: set ppo.engine = fsdp2")
    assert recommend(two, largest, only_sharded_lora, use_lora=False)[1].endswith(
        "nor full FSDP2: set ppo.engine = fsdp2 and ppo.use_lora = true")


def test_a_config_is_counted_on_the_meta_device_as_the_real_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    shape = shape_from_config(config, "llama")
    torch.manual_seed(0)
    assert shape.parameters == sum(p.numel() for p in LlamaForCausalLM(config).parameters()) == 7888
    # q, o 16 x 16; k, v 16 x 8; gate, up, down 16 x 32; two norms of 16
    assert shape.layer_parameters == 2336 and shape.lm_head_parameters == 1600
    assert (shape.kv_width, shape.layers, shape.vocab) == (8, 2, 100)
    assert shape.lora_per_rank == 32 + 24 + 24 + 32 + 48 + 48 + 48
    assert shape.backbone_parameters(1) == 1600 + 16 + 2336  # embeddings, final norm, one layer; no LM head


def test_plan_prints_a_table_for_a_model_folder(tiny_model_dir, capsys):
    assert app.main(["--plan", "--model", str(tiny_model_dir), "--gpu-memory", "1"]) == 0
    out = capsys.readouterr().out
    assert "Memory plan for" in out and "1 GPU: 1 GB a GPU (--gpu-memory)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["ddp"], ["lora"])}
    assert "yes" in rows["ddp"] and "Recommended: ddp" in out


def test_plan_reads_a_folder_holding_only_config_json(tmp_path, capsys):
    folder = tmp_path / "only-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192}))
    assert app.main(["--plan", "--json", "--model", str(folder), "--gpus", "8", "--gpu-memory", "80"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["parameters"] == 8_030_261_248 and plan["gpus"] == 8  # Llama-3-8B
    assert not plan["engines"]["ddp"]["fits"] and plan["engines"]["lora"]["fits"]
    assert plan["engines"]["fsdp2"]["fits"] and plan["engines"]["fsdp2-lora"]["fits"]
    assert plan["recommended"] == "lora"


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--model", "/nonexistent/model"], "cannot read the config"),
])
def test_plan_refuses_bad_input(flags, message, capsys):
    assert app.main(["--plan", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_round_that_would_not_fit_is_refused_before_it_starts(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import loop.memory
    from annotate.store import Store
    from tests.test_round import seed_votes, tiny_settings

    monkeypatch.setattr(loop.memory, "device_memory",
                        lambda gb=None: loop.memory.DeviceMemory(2 * 1024 ** 2, "a 2 MB test device", gpu=False))
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    settings = [arg for setting in tiny_settings(tmp_path) for arg in ("--set", setting)]
    assert app.main(["--train-round", "--db", str(db), "--model", str(tiny_model_dir), *settings]) == 3
    err = capsys.readouterr().err
    assert "PPO would need about" in err and "a 2 MB test device" in err and "--plan" in err
    with Store(db) as store:
        assert store.rounds() == []  # refused while planning: no round row, nothing trained
    assert not (tmp_path / "checkpoints").exists()



def test_the_auto_engine_shards_only_several_processes_whose_ddp_plan_does_not_fit(tiny_model_dir, monkeypatch):
    import loop.memory
    from loop.config_files import load_config
    from loop.memory import with_engine

    config = load_config(None, [f"app.model={tiny_model_dir}"], default_file=None)
    assert config.ppo.engine == "auto" and with_engine(config.ppo, config).engine == "ddp"  # one process
    monkeypatch.setattr(loop.memory, "process_count", lambda: 8)
    assert loop.memory.auto_engine(config) == "ddp"  # the tiny model fits under DDP
    plan = loop.memory.plan_round_memory(config, gpus=8)
    between = (plan.plans["fsdp2"].peak + plan.plans["ddp"].peak) / 2 / 0.9  # FSDP2 fits, DDP does not
    monkeypatch.setattr(loop.memory, "device_memory", lambda gb=None: loop.memory.DeviceMemory(int(between), "t", True))
    assert with_engine(config.ppo, config).engine == "fsdp2"
    lora = load_config(None, [f"app.model={tiny_model_dir}", "ppo.use_lora=true"], default_file=None)
    assert with_engine(lora.ppo, lora).engine == "ddp"  # LoRA fits under DDP where full PPO does not
    # a plan where LoRA does not fit under DDP and does under FSDP2 (the tiny model's whole copy outweighs its shards)
    fits = {"ddp": False, "lora": False, "fsdp2": False, "fsdp2-lora": True}
    unfit_lora = replace(plan, plans={name: SimpleNamespace(fits=lambda memory, ok=ok: ok)
                                      for name, ok in fits.items()})
    monkeypatch.setattr(loop.memory, "plan_round_memory", lambda *args, **kwargs: unfit_lora)
    assert with_engine(lora.ppo, lora).engine == "fsdp2"
    assert loop.memory.run_engine(unfit_lora, replace(lora.ppo, engine="fsdp2")) == "fsdp2-lora"
