"""The reward model's score definition: mean pooling over the answer, scores read from an inner layer, saved and loaded."""

import json

import pytest
import torch

from rlhf.reward.model import RewardModel, truncated_decoder


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def full_model(tiny_model_dir):
    torch.manual_seed(0)
    model = RewardModel.from_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        model.v_head.weight.normal_()  # a head that reads every dimension, so a wrong layer would show
    return model


ROWS = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14]), ([15], [16])]
"""(prompt ids, answer ids) of three sequences of different lengths."""


def padded(side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention_mask, answer_mask) of ROWS, (3, 5) each, padded on `side` with token 0."""
    width = max(len(p) + len(a) for p, a in ROWS)
    ids = torch.zeros((len(ROWS), width), dtype=torch.long)
    mask, answer = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (prompt, answer_ids) in enumerate(ROWS):
        tokens = prompt + answer_ids
        start = 0 if side == "right" else width - len(tokens)
        ids[i, start:start + len(tokens)] = torch.tensor(tokens)
        mask[i, start:start + len(tokens)] = 1
        answer[i, start + len(prompt):start + len(tokens)] = 1
    return ids, mask, answer


def test_truncated_decoder_outputs_the_inner_hidden_state_and_leaves_the_original_whole(full_model):
    ids, mask, _ = padded("right")
    backbone = full_model.backbone
    with torch.no_grad():
        hidden_states = backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for n_layers in (0, 1):
            truncated = truncated_decoder(backbone, n_layers)
            out = truncated(input_ids=ids, attention_mask=mask).last_hidden_state  # (3, 5, D)
            torch.testing.assert_close(out, hidden_states[n_layers], rtol=0, atol=0)
            assert len(truncated.layers) == n_layers == truncated.config.num_hidden_layers
            assert truncated.layers[:n_layers] is not backbone.layers  # its own list over shared layers
            assert n_layers == 0 or truncated.layers[0].mlp.up_proj.weight is backbone.layers[0].mlp.up_proj.weight
        again = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    assert len(backbone.layers) == 2 == backbone.config.num_hidden_layers
    torch.testing.assert_close(again, hidden_states[-1], rtol=0, atol=0)


@pytest.mark.parametrize("layer", [-1, 0, 1])
def test_mean_score_averages_the_answer_values_under_left_and_right_padding(full_model, layer):
    model = RewardModel(full_model.backbone, full_model.v_head, pooling="mean", layer=layer).eval()
    with torch.no_grad():
        # each sequence alone: the mean of v_head(hidden_states[layer]) over its answer positions
        alone = []
        for prompt, answer in ROWS:
            ids = torch.tensor([prompt + answer])
            states = full_model.backbone(input_ids=ids, output_hidden_states=True).hidden_states[layer][0]  # (L, D)
            alone.append(full_model.v_head(states[len(prompt):]).mean())
        alone = torch.stack(alone)  # (3,)
        for side in ("right", "left"):
            ids, mask, answer = padded(side)
            output = model.forward_value(ids, mask, answer)
            torch.testing.assert_close(output.scores, alone, rtol=1e-5, atol=1e-5, msg=side)
            assert output.values.shape == ids.shape
            assert model.forward_value(ids, mask).scores is None  # a critic's call: values only


def test_shared_prompt_pass_gives_the_same_mean_scores(full_model):
    model = RewardModel(full_model.backbone, full_model.v_head, pooling="mean", layer=1).eval()
    ids, mask, answer = padded("right")
    width_p = max(len(p) for p, _ in ROWS)
    width_a = max(len(a) for _, a in ROWS)
    prompt_ids, prompt_mask = torch.zeros((3, width_p), dtype=torch.long), torch.zeros((3, width_p), dtype=torch.long)
    answer_ids, answer_mask = torch.zeros((3, width_a), dtype=torch.long), torch.zeros((3, width_a), dtype=torch.long)
    for i, (prompt, answer_tokens) in enumerate(ROWS):
        prompt_ids[i, width_p - len(prompt):], prompt_mask[i, width_p - len(prompt):] = torch.tensor(prompt), 1
        answer_ids[i, :len(answer_tokens)], answer_mask[i, :len(answer_tokens)] = torch.tensor(answer_tokens), 1
    with torch.no_grad():
        shared = model.forward_shared_prompt(prompt_ids, prompt_mask, answer_ids, answer_mask).scores
        whole = model.forward_value(ids, mask, answer).scores
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)


def test_score_definition_is_saved_and_a_truncated_model_saves_only_its_layers(full_model, tokenizer, tmp_path):
    model = RewardModel(full_model.backbone, full_model.v_head, pooling="mean", layer=1).eval()
    folder = model.save_pretrained(tmp_path / "rm", tokenizer=tokenizer)
    marker = json.loads((folder / "reward_model.json").read_text())
    assert (marker["pooling"], marker["layer"]) == ("mean", 1)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 1
    loaded = RewardModel.from_pretrained(folder).eval()
    assert (loaded.pooling, loaded.layer, len(loaded.backbone.layers)) == ("mean", 1, 1)
    ids, mask, answer = padded("left")
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward_value(ids, mask, answer).scores,
                                   model.forward_value(ids, mask, answer).scores, rtol=0, atol=0)
    # the final norm's weight is kept (as a buffer) so nothing is missing on load, yet nothing trains it
    assert "norm.weight" in dict(loaded.backbone.named_buffers())
    assert all("norm.weight" != name for name, _ in loaded.backbone.named_parameters())


def test_a_folder_saved_before_the_score_definition_loads_as_last_token(full_model, tokenizer, tmp_path):
    folder = full_model.save_pretrained(tmp_path / "rm", tokenizer=tokenizer)
    marker = json.loads((folder / "reward_model.json").read_text())
    del marker["pooling"], marker["layer"]
    (folder / "reward_model.json").write_text(json.dumps(marker))
    loaded = RewardModel.from_pretrained(folder)
    assert (loaded.pooling, loaded.layer, len(loaded.backbone.layers)) == ("last", -1, 2)


def test_bad_score_definitions_are_refused(full_model):
    with pytest.raises(ValueError, match="pooling"):
        RewardModel(full_model.backbone, pooling="max")
    with pytest.raises(ValueError, match="between 0 and 2"):
        RewardModel(full_model.backbone, pooling="mean", layer=3)


# ---- PPO with a mean-pooled reward model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mean_reward_dir(full_model, tiny_model_dir, tmp_path_factory):
    from rlhf.models import load_tokenizer

    model = RewardModel(full_model.backbone, full_model.v_head, pooling="mean", layer=1)
    return model.save_pretrained(tmp_path_factory.mktemp("mean-rm") / "rm", tokenizer=load_tokenizer(tiny_model_dir))


@pytest.mark.parametrize("use_lora", [False, True])
def test_ppo_scores_the_response_mean_and_trains_a_step(tiny_model_dir, mean_reward_dir, use_lora):
    from rlhf.ppo.config import PPOConfig, rollout_sampling
    from rlhf.ppo.train import build_ppo_trainer

    # fp32: compared to 1e-5 with the reward model run alone (auto would be bf16 on a CPU with native bf16)
    config = PPOConfig(batch_size=3, mini_batch_size=3, seed=0, use_lora=use_lora, mixed_precision="no",
                       sampling=rollout_sampling(max_new_tokens=5))
    # the critic starts from the reward model: one decoder layer, per-position values
    trainer = build_ppo_trainer(tiny_model_dir, mean_reward_dir, config)
    critic = trainer.unwrapped_critic()
    assert len((critic.base_model.model if use_lora else critic).backbone.layers) == 1
    prompts = ["hello there", "what is two plus two", "name a colour"]
    sequences, attention_mask, action_mask, ended = trainer.generate(prompts)
    experience, _ = trainer.evaluate(sequences, attention_mask, action_mask, ended)
    # each row alone, without padding: the reward model's values averaged over the response tokens
    reward_model = RewardModel.from_pretrained(mean_reward_dir).eval()
    prompt_width = sequences.shape[1] - action_mask.shape[1]
    expected = []
    with torch.no_grad():
        for row in range(len(prompts)):
            keep = attention_mask[row].bool()
            ids = sequences[row][keep][None]  # (1, n)
            n_answer = int(action_mask[row].sum())
            values = reward_model.forward_value(ids, torch.ones_like(ids)).values[0]  # (n,)
            expected.append(values[-n_answer:].mean())
    assert prompt_width > 0
    torch.testing.assert_close(experience.reward_score, torch.stack(expected), rtol=1e-4, atol=1e-5)
    metrics = trainer.step(prompts)
    assert all(torch.isfinite(torch.tensor(float(metrics[k]))) for k in ("ppo/policy_loss", "ppo/value_loss"))
