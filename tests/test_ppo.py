"""PPO: masks, log-prob alignment, the experience batch, learning a programmatic reward, LoRA, saving."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import app
from annotate.store import Store
from rlhf.losses import actor_loss, critic_loss
from rlhf.models import format_prompt, load_causal_lm, load_tokenizer, resolve_model_path
from rlhf.decode import decode
from rlhf.generate import response_mask_until_eos
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.ppo.experience import position_ids_from_mask, response_log_probs
from rlhf.ppo.train import _same_model, add_lora, build_ppo_trainer, train_ppo
from rlhf.ppo.trainer import PPOTrainer
from rlhf.sampling import Sampling
from rlhf.reward.model import RewardModel, RewardOutput

PROMPTS = ["hello there", "what is two plus two", "tell me a joke", "name a colour"]


class TokenShareReward(torch.nn.Module):
    """Programmatic reward model: score = (tokens of `targets` in the sequence) / `per`; values are zeros.

    It sees whole sequences, so the targets must exclude every prompt token (else the prompt would add a
    per-prompt offset to the score that no answer can change).
    """

    def __init__(self, targets: torch.Tensor, per: int):
        super().__init__()
        self.targets, self.per = targets, per

    def forward_value(self, input_ids, attention_mask, answer_mask=None):
        hits = torch.isin(input_ids, self.targets.to(input_ids.device)) & attention_mask.bool()  # (B, L)
        return RewardOutput(values=torch.zeros(input_ids.shape), scores=hits.sum(-1).float() / self.per)


@pytest.fixture(scope="module")
def module_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer, shared by this module's module-scoped fixtures."""
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory, module_tokenizer) -> Path:
    """A tiny random Llama whose untied output layer has std 1, so (like a trained model, unlike the
    fixture's near-uniform one) it samples from a few likely tokens and PPO has probabilities to move."""
    tokenizer = module_tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
    out = tmp_path_factory.mktemp("peaked-model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def half_vocab_reward(actor, tokenizer, max_new_tokens: int) -> TokenShareReward:
    """Reward the share of answer tokens whose output-layer row points along a fixed random direction u.

    Half the vocabulary qualifies, and moving the final hidden state toward u raises all of them at
    once, so a few steps of a tiny model can learn it.
    """
    u = torch.randn(actor.config.hidden_size, generator=torch.Generator().manual_seed(123))
    targets = set((actor.lm_head.weight.detach() @ u > 0).nonzero().squeeze(-1).tolist())
    for prompt in PROMPTS:
        targets -= set(tokenizer(format_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"])
    return TokenShareReward(torch.tensor(sorted(targets)), per=max_new_tokens)


def zero_head_critic(path) -> RewardModel:
    """A critic from the model with a zero value head: V = 0 at first, so early advantages are the
    (whitened) rewards-to-go instead of a random head's noise."""
    critic = RewardModel.from_causal_lm(path)
    torch.nn.init.zeros_(critic.v_head.weight)
    return critic


def learning_trainer(path, tokenizer, **overrides) -> PPOTrainer:
    settings = dict(batch_size=16, mini_batch_size=16, actor_lr=1e-3, critic_lr=1e-3, whiten_advantages=True, seed=1)
    sampling = {key: overrides.pop(key) for key in list(overrides) if hasattr(Sampling, key)}
    config = PPOConfig(**{**settings, **overrides}, sampling=rollout_sampling(**{"max_new_tokens": 4, **sampling}))
    actor = load_causal_lm(path)
    # The output layer defines the reward's token set, and Adam would move all 49k rows a full step at once.
    actor.lm_head.requires_grad_(False)
    reward = half_vocab_reward(actor, tokenizer, config.sampling.max_new_tokens)
    if config.use_lora:
        return PPOTrainer(add_lora(actor, config, causal_lm=True),
                          add_lora(zero_head_critic(path), config, causal_lm=False), tokenizer, config,
                          reward_model=reward)
    return PPOTrainer(actor, zero_head_critic(path), tokenizer, config, reward_model=reward,
                      reference=load_causal_lm(path))


def favour_eos(model, eos: int, bias: float = 8.0) -> None:
    """Adds `bias` to EOS's logit at every position (the tiny model is near-uniform over 49k tokens, so its answers
    would otherwise never end); sampling and scoring both see it."""
    model.get_output_embeddings().register_forward_hook(lambda _module, _inputs, logits: logits.index_add(
        -1, torch.tensor([eos]), torch.full((*logits.shape[:-1], 1), bias, dtype=logits.dtype)))


# ----- masks and alignment -----


def test_generation_stops_at_eos_and_masks_what_follows(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    config = PPOConfig(seed=0, sampling=rollout_sampling(max_new_tokens=8, min_new_tokens=2))
    trainer = PPOTrainer(load_causal_lm(tiny_model_dir), zero_head_critic(tiny_model_dir), tokenizer, config,
                         reward_model=TokenShareReward(torch.tensor([5]), 8), reference=load_causal_lm(tiny_model_dir))
    favour_eos(trainer.unwrapped_actor(), eos)  # likely once min_new_tokens allows it
    sequences, attention_mask, action_mask, ended = trainer.generate(PROMPTS)
    response = sequences[:, -action_mask.shape[1]:]
    assert ended.all()
    for row in range(len(PROMPTS)):
        first_eos = (response[row] == eos).nonzero()[0].item()
        assert first_eos >= 2  # min_new_tokens
        assert action_mask[row].tolist() == [1] * (first_eos + 1) + [0] * (action_mask.shape[1] - first_eos - 1)
    assert torch.equal(attention_mask[:, -action_mask.shape[1]:], action_mask)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    # padding gets 1 (ignored); real tokens count 0, 1, 2... from their own start
    assert position_ids_from_mask(mask).tolist() == [[1, 1, 0, 1, 2, 1], [0, 1, 2, 3, 4, 5]]


def test_response_log_probs_match_each_prefix_computed_alone(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    trainer_free_batch = tokenizer([format_prompt(tokenizer, p) for p in PROMPTS[:3]], return_tensors="pt",
                                   padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    response = torch.randint(10, 1000, (3, 5))  # (B, T)
    response[0, 2] = tokenizer.eos_token_id  # row 0 ends early: its later positions are padding
    action_mask, _ = response_mask_until_eos(response, [tokenizer.eos_token_id])
    sequences = torch.cat([trainer_free_batch["input_ids"], response], dim=1)
    attention_mask = torch.cat([trainer_free_batch["attention_mask"], action_mask], dim=1)
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, sequences, attention_mask, response.shape[1])
        for row in range(3):
            prompt = trainer_free_batch["input_ids"][row][trainer_free_batch["attention_mask"][row].bool()]
            for t in range(int(action_mask[row].sum())):
                # direct: the unpadded prompt + the first t answer tokens, next-token distribution at the end
                prefix = torch.cat([prompt, response[row, :t]]).unsqueeze(0)
                expected = model(prefix).logits[0, -1].log_softmax(-1)[response[row, t]]
                assert log_probs[row, t].item() == pytest.approx(expected.item(), abs=1e-4)


def test_generation_log_probs_equal_the_scoring_pass(tiny_model_dir, tokenizer):
    """The distribution the decoder drew from (logits / temperature) gives the trainer's log-probs."""
    config = PPOConfig(seed=3, mixed_precision="no", sampling=rollout_sampling(max_new_tokens=6, temperature=0.7))
    model = load_causal_lm(tiny_model_dir).eval()
    trainer = PPOTrainer(model, zero_head_critic(tiny_model_dir), tokenizer, config,
                         reward_model=TokenShareReward(torch.tensor([5]), 6), reference=load_causal_lm(tiny_model_dir))
    batch = trainer.encode_prompts(PROMPTS)
    with torch.no_grad():
        decoded = decode(model, batch["input_ids"], batch["attention_mask"], config.sampling, trainer.ends,
                         with_log_probs=True)
        chosen, width = decoded.response, decoded.response.shape[1]  # (B, T)
        sequences = torch.cat([batch["input_ids"], chosen], dim=1)
        action_mask, _ = response_mask_until_eos(chosen, [tokenizer.eos_token_id])
        attention_mask = torch.cat([batch["attention_mask"], action_mask], dim=1)
        trainer_log_probs, _, _ = trainer.trainable_forward(sequences, attention_mask, width)
        raw, _ = response_log_probs(model, sequences, attention_mask, width)
    real = action_mask.bool()
    assert torch.allclose(trainer_log_probs[real], decoded.log_probs[real], atol=1e-4)
    assert not torch.allclose(raw[real], decoded.log_probs[real], atol=1e-2)  # raw logits are another distribution


class _FixedLogits(torch.nn.Module):
    """A 'model' whose logits at every position are [0, ln 3] over a two-token vocabulary."""

    def forward(self, input_ids, logits_to_keep, **_):
        logits = torch.tensor([0.0, math.log(3.0)]).expand(input_ids.shape[0], logits_to_keep, 2)
        return type("Output", (), {"logits": logits})()


def test_log_probs_are_those_of_the_tempered_distribution():
    sequences = torch.tensor([[0, 1, 0]])  # one prompt token, then the response 1, 0
    mask = torch.ones_like(sequences)
    # T = 1: softmax([0, ln 3]) = [1/4, 3/4]. T = 0.5: softmax([0, 2 ln 3]) = [1/10, 9/10].
    plain, _ = response_log_probs(_FixedLogits(), sequences, mask, 2)
    tempered, entropy = response_log_probs(_FixedLogits(), sequences, mask, 2, with_entropy=True,
                                           sampling=Sampling(temperature=0.5, top_p=1.0, repetition_penalty=1.0))
    assert torch.allclose(plain, torch.tensor([[math.log(3 / 4), math.log(1 / 4)]]))
    assert torch.allclose(tempered, torch.tensor([[math.log(9 / 10), math.log(1 / 10)]]))
    # entropy of [1/10, 9/10] = -(0.1 ln 0.1 + 0.9 ln 0.9) = 0.325083
    assert torch.allclose(entropy, torch.full((1, 2), 0.325083), atol=1e-6)


def test_ppo_needs_a_sampling_temperature():
    with pytest.raises(ValueError, match="temperature"):
        PPOConfig(sampling=rollout_sampling(temperature=0.0))


# ----- the experience batch -----


@pytest.fixture(scope="module")
def experience_trainer(peaked_model_dir, module_tokenizer):
    return learning_trainer(peaked_model_dir, module_tokenizer, max_new_tokens=8, batch_size=4, mini_batch_size=4,
                            min_new_tokens=2, truncation_penalty=0.5)


def test_experience_masks_prompt_and_padding(experience_trainer):
    trainer = experience_trainer
    sequences, attention_mask, action_mask, ended = trainer.generate(PROMPTS)
    experience, _ = trainer.evaluate(sequences, attention_mask, action_mask, ended)
    prompt_mask = trainer.encode_prompts(PROMPTS)["attention_mask"]
    width = action_mask.shape[1]
    assert experience.prompt_width == prompt_mask.shape[1]
    assert torch.equal(experience.attention_mask[:, :-width], prompt_mask)  # left padding stays masked
    assert torch.equal(experience.attention_mask[:, -width:], action_mask)  # so does everything after EOS
    pad = ~action_mask.bool()
    for name in ("rewards", "advantages", "returns", "kl"):
        assert (getattr(experience, name)[pad] == 0).all(), name
    assert torch.equal(experience.response_length, action_mask.sum(-1))
    # the clipped score (here with the 0.5 penalty where the answer never ended) sits on the last real token
    last = action_mask.sum(-1) - 1  # response-only layout: real tokens first
    score = experience.reward_score - 0.5 * (~experience.ended).float()
    kl_part = -trainer.kl_controller.value * experience.kl
    on_last = (experience.rewards - kl_part).gather(1, last.unsqueeze(1)).squeeze(1)
    assert torch.allclose(on_last, score.clamp(-5, 5), atol=1e-6)


def test_masked_positions_do_not_influence_rewards_or_losses(experience_trainer):
    trainer = experience_trainer
    torch.manual_seed(4)
    # force padding after EOS: an answer that stops at its second token
    sequences, attention_mask, action_mask, ended = trainer.generate(PROMPTS)
    action_mask[0, 2:] = 0
    attention_mask[0, -action_mask.shape[1]:] = action_mask[0]
    experience, _ = trainer.evaluate(sequences, attention_mask, action_mask, ended)
    pad = ~action_mask.bool()
    garbage = torch.full_like(experience.log_probs, 1e4)
    poisoned = trainer.make_experience(
        sequences, attention_mask, action_mask, ended,
        torch.where(pad, garbage, experience.log_probs), torch.where(pad, -garbage, experience.ref_log_probs),
        torch.where(pad, garbage, experience.values), experience.reward_score)
    for name in ("rewards", "advantages", "returns"):
        assert torch.equal(getattr(poisoned, name), getattr(experience, name)), name
    new_log_probs = experience.log_probs + 0.1 * torch.randn_like(experience.log_probs)
    new_values = experience.values + 0.1 * torch.randn_like(experience.values)
    clean = actor_loss(new_log_probs, experience.log_probs, experience.advantages, action_mask, 0.2)[0]
    dirty = actor_loss(torch.where(pad, garbage, new_log_probs), poisoned.log_probs, poisoned.advantages,
                       action_mask, 0.2)[0]
    assert torch.equal(clean, dirty)
    clean = critic_loss(new_values, experience.values, experience.returns, action_mask, 0.2)[0]
    dirty = critic_loss(torch.where(pad, garbage, new_values), poisoned.values, poisoned.returns, action_mask, 0.2)[0]
    assert torch.equal(clean, dirty)


# ----- learning -----


def assert_learns(history: list[dict]) -> None:
    scores = [m["ppo/score"] for m in history]
    assert all(math.isfinite(m["ppo/kl"]) and m["ppo/kl"] < 50 for m in history), [m["ppo/kl"] for m in history]
    assert sum(scores[-3:]) / 3 > scores[0] + 0.1, scores


def test_ppo_raises_a_programmatic_reward(peaked_model_dir, tokenizer):
    trainer = learning_trainer(peaked_model_dir, tokenizer, steps=6)
    history = trainer.train(PROMPTS * 4)
    assert_learns(history)
    expected = {"ppo/reward", "ppo/score", "ppo/kl", "ppo/kl_ctl", "ppo/policy_loss", "ppo/value_loss",
                "ppo/clipfrac", "ppo/approx_kl", "ppo/entropy", "ppo/response_len", "time/generate",
                "time/score", "time/update"}
    assert expected <= set(history[0])
    assert history[0]["ppo/approx_kl"] == 0.0  # first update's ratio is exactly 1: the same forward pass


def test_a_run_stops_after_the_step_whose_kl_passes_stop_at_kl(peaked_model_dir, tokenizer):
    trainer = learning_trainer(peaked_model_dir, tokenizer, steps=6, stop_at_kl=1.0)
    kls = iter([0.0, 0.6, 1.0, 1.4, 0.2, 0.1])  # the third is at the limit, not above it: the fourth ends the run
    trainer.step = lambda batch: {"ppo/score": 0.0, "ppo/kl": next(kls)}
    history = trainer.train(PROMPTS * 4)
    assert [m["ppo/kl"] for m in history] == [0.0, 0.6, 1.0, 1.4]
    assert [m["ppo/step"] for m in history] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="stop_at_kl"):
        PPOConfig(stop_at_kl=-0.5)


def test_lora_ppo_learns_with_the_reference_held_once(peaked_model_dir, tokenizer, tmp_path):
    # fp32: the reference must equal the base model to 1e-5, which bf16 autocast (auto on a bf16 CPU) would not
    trainer = learning_trainer(peaked_model_dir, tokenizer, steps=6, use_lora=True, lora_lr=1e-3, mixed_precision="no")
    history = trainer.train(PROMPTS * 4)
    assert_learns(history)
    assert trainer.reference is None  # no second copy: the reference is the actor with adapters disabled
    base = load_causal_lm(peaked_model_dir).eval()
    sequences, attention_mask, action_mask, _ = trainer.generate(PROMPTS)
    width = action_mask.shape[1]
    real = action_mask.bool()
    with torch.inference_mode():
        reference = trainer.reference_log_probs(sequences, attention_mask, width)
        sampling = trainer.config.sampling
        untouched = response_log_probs(base, sequences, attention_mask, width, sampling=sampling)[0]
        trained = response_log_probs(trainer.unwrapped_actor(), sequences, attention_mask, width, sampling=sampling)[0]
    assert torch.allclose(reference[real], untouched[real], atol=1e-5)
    assert not torch.allclose(trained[real], untouched[real], atol=1e-3)

    saved = trainer.save_actor(tmp_path / "adapters")  # the adapters alone (tests/test_lora_adapters.py)
    assert (saved / "adapter_config.json").is_file() and not (saved / "model.safetensors").exists()
    reloaded = load_causal_lm(saved).eval()  # the base with the adapters merged in
    with torch.inference_mode():
        merged = response_log_probs(reloaded, sequences, attention_mask, width, sampling=sampling)[0]
    assert torch.allclose(merged[real], trained[real], atol=1e-4)
    assert hasattr(trainer.unwrapped_actor(), "disable_adapter")  # saving left the trained actor as it was


def test_bf16_ppo_learns_with_the_first_ratio_still_exact(peaked_model_dir, tokenizer):
    trainer = learning_trainer(peaked_model_dir, tokenizer, steps=6, mixed_precision="bf16")
    assert trainer.accelerator.mixed_precision == "bf16"
    history = trainer.train(PROMPTS * 4)
    assert_learns(history)
    assert history[0]["ppo/approx_kl"] == 0.0  # old and new log-probs come from the same bf16 forward


def test_several_epochs_over_mini_batches_and_adaptive_kl(peaked_model_dir, tokenizer):
    trainer = learning_trainer(peaked_model_dir, tokenizer, batch_size=8, mini_batch_size=4, ppo_epochs=2,
                               adaptive_kl=True, kl_target=1.0, kl_horizon=100.0)
    assert not trainer.config.fused_first_update
    first = trainer.step(PROMPTS * 2)
    second = trainer.step(PROMPTS * 2)
    assert first["ppo/approx_kl"] > 0  # later mini-batches see an already updated actor
    # Ziegler et al.: kl_ctl *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon, with n = 8 sequences
    error = min(max(first["ppo/kl"] / 1.0 - 1, -0.2), 0.2)
    assert second["ppo/kl_ctl"] == pytest.approx(0.1 * (1 + error * 8 / 100.0))


def test_reusing_the_first_forward_gives_the_same_update(peaked_model_dir, tokenizer):
    results = []
    for reuse in (True, False):
        # fp32: under bf16 the inference-mode pass and the graph-building one may round differently
        trainer = learning_trainer(peaked_model_dir, tokenizer, batch_size=4, mini_batch_size=4, reuse_forward=reuse,
                                   mixed_precision="no")
        assert trainer.config.fused_first_update is reuse
        metrics = trainer.step(PROMPTS)
        results.append((metrics, [p.detach().clone() for p in trainer.unwrapped_actor().parameters()]))
    (fused, fused_weights), (separate, separate_weights) = results
    for name in ("ppo/score", "ppo/kl", "ppo/policy_loss", "ppo/value_loss"):
        assert fused[name] == pytest.approx(separate[name], abs=1e-5), name
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fused_weights, separate_weights))


def test_saved_actor_loads_back_identical(tiny_model_dir, tokenizer, tmp_path):
    # fp32: the trainer's actor runs under accelerate's autocast wrapper in bf16, the reloaded model would not
    trainer = learning_trainer(tiny_model_dir, tokenizer, batch_size=4, mini_batch_size=4, mixed_precision="no")
    trainer.step(PROMPTS)
    saved = trainer.save_actor(tmp_path / "actor")
    reloaded = load_causal_lm(saved).eval()
    ids = trainer.encode_prompts(PROMPTS)
    with torch.inference_mode():
        assert torch.equal(reloaded(**ids).logits, trainer.unwrapped_actor()(**ids).logits)
    assert (saved / "tokenizer_config.json").is_file()


# ----- whole runs and the command -----


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model_dir, module_tokenizer) -> Path:
    """An (untrained) reward model folder on the tiny model, as --train-reward would save it."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("reward-model")
    return RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(out, tokenizer=module_tokenizer)


def test_train_ppo_runs_from_folders_and_saves_a_plain_model(tiny_model_dir, reward_model_dir, tmp_path):
    seen = []
    config = PPOConfig(batch_size=2, mini_batch_size=2, steps=2, sampling=rollout_sampling(max_new_tokens=4))
    result = train_ppo(tiny_model_dir, reward_model_dir, PROMPTS, config, tmp_path / "actor", on_step=seen.append)
    assert [m["ppo/step"] for m in result.history] == [1, 2] and seen == result.history
    assert result.config["sampling"]["max_new_tokens"] == 4 and result.config["sampling"]["temperature"] == 0.7
    assert load_causal_lm(result.saved_path).config.vocab_size == 49152


def test_a_reward_function_scores_the_decoded_answers_in_place_of_the_reward_model(tiny_model_dir, reward_model_dir):
    seen = []

    def plus_one(texts: list[str]) -> list[float]:
        seen.append(list(texts))
        return [1.0] * len(texts)

    config = PPOConfig(batch_size=4, mini_batch_size=4, seed=3, sampling=rollout_sampling(max_new_tokens=6))
    trainer = build_ppo_trainer(tiny_model_dir, reward_model_dir, config, reward_function=plus_one)
    assert trainer.reward_model is None  # never loaded: the function scores the answers
    tokenizer, eos, pad = trainer.tokenizer, trainer.tokenizer.eos_token_id, trainer.tokenizer.pad_token_id
    words = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("Hello world", "Good bye now")]
    response = torch.tensor([words[0] + [eos] + [pad] * (5 - len(words[0])),  # ended: the EOS and padding left out
                             (words[1] * 2)[:6]])  # (2, 6); cut at the limit: every token kept
    prompt = torch.tensor([[pad, 17, 18], [19, 20, 21]])  # (2, 3) left-padded
    action_mask, ended = response_mask_until_eos(response, list(trainer.ends.eos_ids))  # (2, 6)
    sequences = torch.cat([prompt, response], dim=1)  # (2, 9)
    expected = ["Hello world", tokenizer.decode((words[1] * 2)[:6]).strip()]
    assert trainer.answer_texts(sequences, action_mask, ended) == expected
    scores = trainer.reward_scores(sequences, torch.ones_like(sequences), action_mask, ended)
    assert scores.tolist() == [1.0, 1.0] and seen == [expected]
    metrics = trainer.step(PROMPTS)
    assert metrics["ppo/score"] == 1.0  # the function's score, as produced (before normalisation and clipping)
    assert len(seen) == 2 and len(seen[1]) == len(PROMPTS) and all(isinstance(text, str) for text in seen[1])


def test_bf16_autocasts_every_model_kept_in_fp32(tiny_model_dir, reward_model_dir):
    config = PPOConfig(batch_size=2, mini_batch_size=2, mixed_precision="bf16",
                       sampling=rollout_sampling(max_new_tokens=4))
    trainer = build_ppo_trainer(tiny_model_dir, reward_model_dir, config)
    assert trainer.accelerator.mixed_precision == "bf16"
    # fp32 weights everywhere: AdamW updates stay exact, and a frozen reference computes as the actor does
    for model in (trainer.reference, trainer.reward_model, trainer.unwrapped_actor(), trainer.unwrapped_critic()):
        assert next(model.parameters()).dtype == torch.float32
    metrics = trainer.step(PROMPTS[:2])
    # actor == reference before the first update: their bf16 log-probs agree, so the step's KL is 0; a bf16-stored
    # reference (or a bf16 division by the temperature) measured 0.03-0.04 per answer on the default model
    assert abs(metrics["ppo/kl"]) < 1e-6
    assert math.isfinite(metrics["ppo/value_loss"])
    fp32 = build_ppo_trainer(tiny_model_dir, reward_model_dir, PPOConfig(
        batch_size=2, mini_batch_size=2, mixed_precision="no", sampling=rollout_sampling(max_new_tokens=4)))
    assert fp32.accelerator.mixed_precision == "no"  # one process may switch precision (reward model, then PPO)


def test_command_trains_from_a_prompt_file(tiny_model_dir, reward_model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello there"}\n{"prompt": "tell me a joke"}\n', encoding="utf-8")
    code = app.main(["--train-ppo", "--model", str(tiny_model_dir), "--reward-model", str(reward_model_dir),
                     "--prompts", str(prompts), "--steps", "1", "--out", str(tmp_path / "actor"),
                     "--ppo-batch-size", "2", "--ppo-max-new-tokens", "4",
                     "--db", str(tmp_path / "none.db")])
    assert code == 0
    assert "Actor saved to" in capsys.readouterr().out
    assert (tmp_path / "actor" / "model.safetensors").is_file()


@pytest.mark.parametrize("extra, message", [
    ([], "needs --reward-model"),
    (["--reward-model", "{tiny}"], "is not a reward model folder"),
    (["--reward-model", "{rm}"], "no database at"),
    (["--reward-model", "{rm}", "--prompts", "{missing}"], "no such file"),
    # the flags set [ppo]: each value outside its key's range is refused by the flag and the key (--steps 0 is
    # ppo.steps = 0, the default: `epochs` passes over the prompts)
    (["--reward-model", "{rm}", "--steps", "-1"], "--steps: ppo.steps must be 0 or more (0: `epochs` passes over the "
                                                  "prompts), not -1"),
    (["--reward-model", "{rm}", "--ppo-max-new-tokens", "0"], "ppo.sampling.max_new_tokens must be at least 1, not 0"),
    (["--reward-model", "{rm}", "--ppo-batch-size", "0"], "--ppo-batch-size: ppo.batch_size must be at least 1, not 0"),
])
def test_command_errors_say_what_to_do(extra, message, tiny_model_dir, reward_model_dir, tmp_path, capsys):
    names = {"tiny": tiny_model_dir, "rm": reward_model_dir, "missing": tmp_path / "missing.jsonl"}
    argv = ["--train-ppo", "--model", str(tiny_model_dir), "--db", str(tmp_path / "none.db")]
    code = app.main(argv + [arg.format(**names) for arg in extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_command_reads_prompts_from_the_store(tiny_model_dir, reward_model_dir, tmp_path, capsys):
    db = tmp_path / "loop.db"
    with Store(db) as store:
        assert app.main(["--train-ppo", "--model", str(tiny_model_dir), "--reward-model", str(reward_model_dir),
                         "--db", str(db)]) == 2
        assert "holds no prompts" in capsys.readouterr().err
        store.add_prompts(["hello there", "name a colour"])
    code = app.main(["--train-ppo", "--model", str(tiny_model_dir), "--reward-model", str(reward_model_dir),
                     "--db", str(db), "--steps", "1", "--out", str(tmp_path / "actor"),
                     "--ppo-batch-size", "2", "--ppo-max-new-tokens", "4"])
    assert code == 0 and "on 2 prompts" in capsys.readouterr().out


def test_command_trains_as_the_round_would_on_that_reward_model(reward_model_dir, tmp_path, capsys, monkeypatch):
    """--train-ppo takes [ppo] through loop.config.ppo_settings: a head reward model gets normalised scores and
    GAE lambda 1 as in the round; the flags set [ppo] (--seed is the simulated annotators', not PPO's)."""
    import json
    import shutil
    from types import SimpleNamespace

    from rlhf.reward.strategies import STRATEGY_FILE

    used = []

    def fake_train_ppo(model, reward_path, prompts, config, out_dir, reference_path=None):
        used.append(config)
        return SimpleNamespace(history=[{"ppo/score": 0.5, "ppo/kl": 0.01}], saved_path=out_dir)

    monkeypatch.setattr("rlhf.ppo.train.train_ppo", fake_train_ppo)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n", encoding="utf-8")
    head = shutil.copytree(reward_model_dir, tmp_path / "head")
    (head / STRATEGY_FILE).write_text(json.dumps({"strategy": "head"}))
    for reward in (reward_model_dir, head):
        assert app.main(["--train-ppo", "--reward-model", str(reward), "--prompts", str(prompts), "--out",
                         str(tmp_path / "actor"), "--ppo-batch-size", "2", "--seed", "5",
                         "--set", "ppo.seed=7", "--set", "ppo.lam=0.9"]) == 0
    plain, adapted = used
    assert (plain.normalize_rewards, plain.lam) == (False, 0.9)
    assert (adapted.normalize_rewards, adapted.lam) == (True, 1.0)
    for config in used:
        assert (config.batch_size, config.mini_batch_size, config.seed) == (2, 2, 7)
    assert "Head reward model: scores normalised, GAE lambda 1" in capsys.readouterr().err


def test_lora_shares_weights_only_with_the_same_folder(tmp_path, monkeypatch):
    (tmp_path / "policy").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    assert _same_model("policy", tmp_path / "policy")  # relative and absolute spellings of one folder
    assert not _same_model("policy", tmp_path / "other")
    assert _same_model("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M")


@pytest.mark.slow
def test_one_ppo_step_of_the_default_model(tmp_path):
    path = resolve_model_path("default")
    RewardModel.from_causal_lm(path).save_pretrained(tmp_path / "rm", tokenizer=load_tokenizer(path))
    config = PPOConfig(batch_size=2, mini_batch_size=2, steps=1, sampling=rollout_sampling(max_new_tokens=8))
    trainer = build_ppo_trainer(path, tmp_path / "rm", config)
    metrics = trainer.step(PROMPTS[:2])
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    assert metrics["ppo/kl"] == pytest.approx(0.0, abs=1e-4)  # actor == reference before the first update
    assert 1 <= metrics["ppo/response_len"] <= 8


def test_the_fsdp2_engine_refuses_an_unknown_engine_and_a_lone_process(tiny_model_dir, tmp_path):
    from rlhf.ppo.config import PPOConfig
    from rlhf.ppo.train import build_ppo_trainer
    from rlhf.models import load_tokenizer
    from rlhf.reward.model import RewardModel

    with pytest.raises(ValueError, match="engine must be one of auto, ddp, fsdp2, not 'zero3'"):
        PPOConfig(engine="zero3")
    reward = RewardModel.from_causal_lm(tiny_model_dir).save_pretrained(tmp_path / "rm",
                                                                         tokenizer=load_tokenizer(tiny_model_dir))
    with pytest.raises(ValueError, match="needs the processes a launcher starts"):
        build_ppo_trainer(tiny_model_dir, reward, PPOConfig(engine="fsdp2", mixed_precision="no"))
