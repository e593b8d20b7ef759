"""A reward PPO can trust (#34): the bootstrap heads' mean less k times their spread, and a budget of drift."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.decode import position_ids_from_mask
from rlhf.ppo import train as ppo_train
from rlhf.ppo.config import PPOConfig, rollout_sampling
from rlhf.ppo.train import build_ppo_trainer
from rlhf.ppo.trainer import PPOTrainer
from rlhf.reward import bt_head
from rlhf.reward.conservative import conservative_scores, drift_exceeded, head_spread
from rlhf.reward.data import PreferencePair
from rlhf.reward.model import RewardModel
from rlhf.reward.strategies import (HEADS_FILE, STRATEGY_FILE, TUNED_HEADS_FILE, StrategyConfig, VotesConfig,
                                    score_heads, train_strategy)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello there", "what is two plus two", "tell me a joke", "name a colour"]
K = 0.5

# ----- the maths, by hand -----

HEAD_SCORES = torch.tensor([[1.0, 0.0, 5.0],
                            [1.0, 0.0, 5.0],
                            [3.0, 0.0, 5.0],
                            [3.0, 8.0, 5.0]])  # (H=4 heads, N=3 answers)


def test_the_spread_is_the_population_std_over_the_heads():
    # answer 0: 1, 1, 3, 3: mean 2, deviations -1 -1 +1 +1, squares sum 4, / 4 heads = 1: std 1 (sample: sqrt(4/3))
    # answer 1: 0, 0, 0, 8: mean 2, deviations -2 -2 -2 +6, squares 4 + 4 + 4 + 36 = 48, / 4 = 12: std sqrt(12)
    # answer 2: 5, 5, 5, 5: std 0
    assert head_spread(HEAD_SCORES).tolist() == pytest.approx([1.0, math.sqrt(12.0), 0.0])


def test_the_conservative_score_is_the_heads_mean_less_k_spreads():
    # k = 0.5: answer 0: 2 - 0.5 * 1 = 1.5; answer 1: 2 - 0.5 * sqrt(12) = 2 - sqrt(3) = 0.26795; answer 2: 5 - 0 = 5
    assert conservative_scores(HEAD_SCORES, 0.5).tolist() == pytest.approx([1.5, 2.0 - math.sqrt(3.0), 5.0])
    # k = 2: 2 - 2 = 0; 2 - 2 * sqrt(12) = -4.9282; 5
    assert conservative_scores(HEAD_SCORES, 2.0).tolist() == pytest.approx([0.0, 2.0 - 2 * math.sqrt(12.0), 5.0])
    assert conservative_scores(HEAD_SCORES, 0.0).tolist() == [2.0, 2.0, 5.0]  # the plain mean


def test_the_spread_is_the_one_the_pair_disagreement_uses():
    heads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # (H=3, D=2)
    features_a, features_b = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]])  # (1, D) each
    probs = bt_head.member_probs(heads, features_a, features_b)  # (H, 1): sigmoid(2), sigmoid(-1), sigmoid(1)
    assert head_spread(probs).tolist() == pytest.approx(
        bt_head.ensemble_disagreement(heads, features_a, features_b).tolist())


def test_the_drift_budget_is_exceeded_above_its_limit_only():
    # first 0.25, budget 1: limit (1 + 1) * 0.25 = 0.5
    assert not drift_exceeded(0.25, 0.4, 1.0)
    assert not drift_exceeded(0.25, 0.5, 1.0)  # at the limit: not yet
    assert drift_exceeded(0.25, 0.5001, 1.0)
    # first 2, budget 0.5: limit 1.5 * 2 = 3
    assert not drift_exceeded(2.0, 3.0, 0.5) and drift_exceeded(2.0, 3.01, 0.5)
    assert not drift_exceeded(2.0, 1.0, 0.5)  # a spread that shrank
    assert drift_exceeded(0.0, 1e-9, 0.5) and not drift_exceeded(0.0, 0.0, 0.5)


def test_the_settings_refuse_negative_values():
    with pytest.raises(ValueError, match="reward_spread_penalty"):
        PPOConfig(reward_spread_penalty=-0.1)
    with pytest.raises(ValueError, match="drift_budget"):
        PPOConfig(drift_budget=-1.0)


# ----- reward models on the tiny model -----

def tea_votes() -> list[PreferencePair]:
    return [PreferencePair(f"Tell me about tea #{i}.", "Thank you, happy to help: it is lovely.", f"Tea {i}.")
            for i in range(12)]


@pytest.fixture(scope="module")
def head_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A "head" reward model with 4 bootstrap heads on the tiny model's first layer, mean-pooled."""
    config = StrategyConfig(votes=VotesConfig(n_heads=4, cv_folds=3, feature="mean@1"))
    return train_strategy("head", tea_votes(), str(tiny_model_dir), config).save(tmp_path_factory.mktemp("head"))


@pytest.fixture(scope="module")
def plain_dir(head_dir, tmp_path_factory) -> Path:
    """The same reward model as a folder of `--train-reward`'s kind: no strategy file, no heads."""
    out = tmp_path_factory.mktemp("plain") / "rm"
    shutil.copytree(head_dir, out)
    (out / STRATEGY_FILE).unlink()
    (out / HEADS_FILE).unlink()
    return out


def test_the_reward_model_scores_answers_under_each_head_from_one_pass(head_dir, tokenizer):
    model = RewardModel.from_pretrained(head_dir).eval()
    encoded = tokenizer(["a cup of tea", "no"], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]  # (2, L) each
    answer = mask.clone()
    answer[:, :2] = 0  # the "answer": all but the first two positions
    w = model.v_head.weight.detach()  # (1, D)
    with torch.inference_mode():
        plain = model.forward_value(ids, mask, answer)
        both = model.forward_value(ids, mask, answer, heads=torch.cat([w, -2 * w]))  # (H=2, D): v_head, -2 v_head
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model.forward_value(ids, mask, answer, heads=w)
    assert plain.head_scores is None
    assert torch.equal(both.values, plain.values) and torch.equal(both.scores, plain.scores)  # unchanged
    # the mean over the answer of w . h is the score; of -2 w . h, -2 times it
    assert both.head_scores[:, 0].tolist() == pytest.approx(plain.scores.tolist(), abs=1e-6)
    assert both.head_scores[:, 1].tolist() == pytest.approx((-2 * plain.scores).tolist(), abs=1e-6)
    assert autocast.head_scores.dtype == torch.float32 and autocast.head_scores.shape == (2, 1)


def ppo_config(**settings) -> PPOConfig:
    return PPOConfig(**{"batch_size": 2, "mini_batch_size": 2, "steps": 2, "mixed_precision": "no", "seed": 5,
                        **settings}, sampling=rollout_sampling(max_new_tokens=4))


def capture_experiences(trainer: PPOTrainer) -> list:
    """The Experience of every step the trainer evaluates, in order."""
    seen, evaluate = [], trainer.evaluate

    def evaluate_and_keep(*args, **kwargs):
        result = evaluate(*args, **kwargs)
        seen.append(result[0])
        return result

    trainer.evaluate = evaluate_and_keep
    return seen


@torch.inference_mode()
def heads_and_main_scores(folder: Path, experience) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, H) each bootstrap head's score, (B,) the main head's) of the experience's answers, worked out here: the
    saved backbone's hidden states averaged over each answer's tokens, times the saved heads."""
    model = RewardModel.from_pretrained(folder).eval()
    sequences, mask = experience.sequences, experience.attention_mask
    hidden = model.backbone(input_ids=sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                            use_cache=False).last_hidden_state.double()  # (B, L, D)
    answer = torch.zeros(sequences.shape, dtype=torch.float64)  # (B, L)
    answer[:, -experience.action_mask.shape[1]:] = experience.action_mask.double()
    features = (hidden * answer[..., None]).sum(1) / answer.sum(1, keepdim=True)  # (B, D) mean over the answer
    heads = load_file(str(folder / HEADS_FILE))["heads"].double()  # (H, D)
    return features @ heads.T, features @ model.v_head.weight.double().reshape(-1)  # (B, H), (B,)


@pytest.mark.parametrize("use_lora", [False, True])
def test_with_a_spread_penalty_the_reward_is_the_heads_mean_less_k_spreads(tiny_model_dir, head_dir, use_lora):
    trainer = build_ppo_trainer(tiny_model_dir, head_dir, ppo_config(reward_spread_penalty=K, use_lora=use_lora))
    assert (trainer.reward_model is None) == use_lora  # LoRA: the critic with its adapters off scores
    experiences = capture_experiences(trainer)
    history = trainer.train(PROMPTS)
    assert len(experiences) == len(history) == 2
    for experience, metrics in zip(experiences, history):
        head_scores, main = heads_and_main_scores(head_dir, experience)  # (B, H), (B,)
        mean = head_scores.mean(1)  # (B,)
        std = ((head_scores - mean[:, None]) ** 2).mean(1).sqrt()  # (B,) population: divided by H
        expected = mean - K * std  # (B,)
        assert experience.reward_score.double().tolist() == pytest.approx(expected.tolist(), abs=1e-5)
        assert experience.head_spread.double().tolist() == pytest.approx(std.tolist(), abs=1e-5)
        assert metrics["ppo/score"] == pytest.approx(float(expected.mean()), abs=1e-5)
        assert metrics["ppo/head_spread"] == pytest.approx(float(std.mean()), abs=1e-5)
        assert (std > 1e-4).all()  # the heads disagree: the penalty moved every reward
        assert (experience.reward_score.double() - main).abs().max() > 1e-4  # not the main head's score


def test_without_a_penalty_the_reward_is_the_main_heads_bit_for_bit(tiny_model_dir, head_dir, plain_dir):
    runs = {}
    for folder in (head_dir, plain_dir):  # plain_dir: today's reward model, no heads at all
        trainer = build_ppo_trainer(tiny_model_dir, folder, ppo_config())  # seeds the sampling: build, then train
        seen = capture_experiences(trainer)
        runs[folder] = trainer.reward_heads, seen, trainer.train(PROMPTS)
    (heads, seen_with, history_with), (no_heads, seen_without, history_without) = runs[head_dir], runs[plain_dir]
    assert heads.shape == (4, 32) and no_heads is None
    for experience, today in zip(seen_with, seen_without):
        assert torch.equal(experience.sequences, today.sequences)
        assert torch.equal(experience.reward_score, today.reward_score)  # the same bits
        assert today.head_spread is None and experience.head_spread is not None
        main = heads_and_main_scores(head_dir, experience)[1]  # (B,)
        assert experience.reward_score.double().tolist() == pytest.approx(main.tolist(), abs=1e-5)
    timing = ("time/", "gen/tokens_per_s")
    for metrics, today in zip(history_with, history_without):
        assert metrics["ppo/head_spread"] > 0 and "ppo/head_spread" not in today  # recorded where there are heads
        assert {k: v for k, v in metrics.items() if not k.startswith(timing) and k != "ppo/head_spread"} == \
            {k: v for k, v in today.items() if not k.startswith(timing)}


def widen_heads_after_the_first_step(trainer: PPOTrainer, factor: float):
    """An on_step that spreads the trainer's heads `factor` times wider about their mean after step 1: every answer's
    head spread is then `factor` times what it would be (the mean and the main head stay)."""
    def on_step(metrics: dict) -> None:
        if metrics["ppo/step"] == 1:
            mean = trainer.reward_heads.mean(0, keepdim=True)  # (1, D)
            trainer.reward_heads = mean + factor * (trainer.reward_heads - mean)  # (H, D)
    return on_step


@pytest.mark.parametrize("budget, steps_run", [(1.0, 2), (100.0, 4), (0.0, 4)])
def test_the_drift_budget_ends_the_run_when_the_heads_spread_grows(tiny_model_dir, head_dir, capsys, budget,
                                                                   steps_run):
    # After step 1 each answer's spread is 10 times what it would be: above (1 + 1) times step 1's, below 101 times;
    # budget 0 is off.
    trainer = build_ppo_trainer(tiny_model_dir, head_dir, ppo_config(steps=4, drift_budget=budget))
    history = trainer.train(PROMPTS, on_step=widen_heads_after_the_first_step(trainer, 10.0))
    spreads = [m["ppo/head_spread"] for m in history]
    assert len(history) == steps_run and spreads[1] > 2 * spreads[0]
    assert spreads[1] < 101 * spreads[0]
    stopped = [m.get("ppo/drift_stopped") for m in history]
    assert stopped == ([None] * (steps_run - 1) + [1.0] if budget == 1.0 else [None] * steps_run)
    captured = capsys.readouterr()
    said = "PPO: stopped after step 2 of 4: head spread" in captured.out + captured.err
    assert said == (budget == 1.0)


def test_the_drift_budget_counts_from_the_first_steps_spread(tiny_model_dir, head_dir):
    trainer = build_ppo_trainer(tiny_model_dir, head_dir, ppo_config(steps=6, drift_budget=1.0))
    spreads = iter([0.25, 0.4, 0.5, 0.75, 0.1, 0.1])  # limit (1 + 1) * 0.25 = 0.5: the fourth step is above it
    trainer.step = lambda batch: {"ppo/score": 0.0, "ppo/kl": 0.0, "ppo/head_spread": next(spreads)}
    history = trainer.train(PROMPTS)
    assert [m["ppo/head_spread"] for m in history] == [0.25, 0.4, 0.5, 0.75]
    assert [m.get("ppo/drift_stopped") for m in history] == [None, None, None, 1.0]


# ----- no heads: refused before any model loads -----

def refuse_loading(monkeypatch):
    """Make loading the actor's tokenizer (the first thing build_ppo_trainer loads) fail the test."""
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")
    monkeypatch.setattr(ppo_train, "load_tokenizer", no_loading)


def test_a_penalty_without_heads_says_what_to_set(tiny_model_dir, plain_dir, monkeypatch):
    refuse_loading(monkeypatch)
    with pytest.raises(ValueError) as refused:
        build_ppo_trainer(tiny_model_dir, plain_dir, ppo_config(reward_spread_penalty=K))
    message = str(refused.value)
    assert message.startswith("ppo.reward_spread_penalty = 0.5 needs the reward model's bootstrap heads")
    assert str(plain_dir) in message and "no head strategy trained it" in message
    assert 'votes.strategy "head", "ensemble" or "lpft"' in message and "votes.n_heads of 2 or more" in message
    assert message.endswith("or set ppo.reward_spread_penalty = 0.")
    with pytest.raises(ValueError, match=r"^ppo.drift_budget = 0.2 needs .* or set ppo.drift_budget = 0.$"):
        build_ppo_trainer(tiny_model_dir, plain_dir, ppo_config(drift_budget=0.2))
    with pytest.raises(ValueError, match="need the reward model's .* ppo.reward_spread_penalty = 0 and "
                                         "ppo.drift_budget = 0"):
        build_ppo_trainer(tiny_model_dir, plain_dir, ppo_config(reward_spread_penalty=K, drift_budget=0.2))
    with pytest.raises(ValueError, match="a reward function scores the answers"):
        build_ppo_trainer(tiny_model_dir, plain_dir, ppo_config(reward_spread_penalty=K),
                          reward_function=lambda texts: [0.0] * len(texts))


def test_one_head_or_a_fine_tuned_reward_model_has_no_heads_to_trust(tiny_model_dir, head_dir, tmp_path,
                                                                     monkeypatch):
    one_head = train_strategy("head", tea_votes(), str(tiny_model_dir),
                              StrategyConfig(votes=VotesConfig(n_heads=0, cv_folds=3))).save(tmp_path / "one")
    assert score_heads(one_head)[0] is None and "1 head (votes.n_heads was 0 or 1)" in score_heads(one_head)[1]
    full = tmp_path / "full"
    shutil.copytree(head_dir, full)
    saved = json.loads((full / STRATEGY_FILE).read_text())
    (full / STRATEGY_FILE).write_text(json.dumps({**saved, "strategy": "full"}))
    assert score_heads(full)[0] is None and "frozen base model's features" in score_heads(full)[1]
    assert score_heads(head_dir)[0].shape == (4, 32)
    refuse_loading(monkeypatch)
    for folder, why in ((one_head, "it holds 1 head"), (full, 'its strategy "full" fine-tuned the decoder')):
        with pytest.raises(ValueError, match=why):
            build_ppo_trainer(tiny_model_dir, folder, ppo_config(reward_spread_penalty=K))


def lpft_config(tuned_heads: bool) -> StrategyConfig:
    return StrategyConfig(votes=VotesConfig(n_heads=4, cv_folds=3, feature="mean@1", finetune_epochs=2,
                                            finetune_lr=1e-2), tuned_heads=tuned_heads)


def test_an_lpft_reward_model_fits_its_heads_on_its_own_fine_tuned_features(tiny_model_dir, tmp_path):
    """LP-FT moves the layer the heads read: PPO's heads are refitted on the tuned layer's output, the features its
    v_head and forward_value(heads=) read, and PPO takes them; without them an lpft folder has none to trust."""
    from rlhf.losses import graded_terms
    from rlhf.models import load_tokenizer
    from rlhf.reward.features import FeatureExtractor
    from rlhf.reward.incremental import pair_key

    votes = tea_votes()
    trained = train_strategy("lpft", votes, str(tiny_model_dir), lpft_config(tuned_heads=True))
    folder = trained.save(tmp_path / "lpft")
    heads, why = score_heads(folder)
    assert why == "" and heads.shape == (4, 32)
    # the same fit, by hand, on the saved model's own features of the trained votes (same lambda, seed, no grades)
    model = RewardModel.from_pretrained(folder).eval()
    own = FeatureExtractor(model, load_tokenizer(folder), max_length=512)
    train = [v for v in votes if pair_key(v) in set(trained.trained_pairs)]  # the held-out ones are not fitted
    prompts = [v.prompt for v in train]
    diffs = own.features(prompts, [v.chosen for v in train], "mean@-1") - own.features(
        prompts, [v.rejected for v in train], "mean@-1")
    votes_config = lpft_config(True).votes
    margins, weights = graded_terms(torch.ones(len(train), dtype=torch.float64), votes_config.graded,
                                    votes_config.much_margin, votes_config.much_weight)
    refit = bt_head.fit_bootstrap_heads(diffs, trained.metrics["rm/lambda"], 4, seed=0, weights=weights,
                                        margins=margins)
    assert torch.allclose(heads.double(), refit.double(), atol=1e-5)
    base_heads = load_file(str(folder / HEADS_FILE))["heads"]
    assert not torch.allclose(heads, base_heads.float(), atol=1e-3)  # the tuned layer moved the features
    trainer = build_ppo_trainer(tiny_model_dir, folder, ppo_config(reward_spread_penalty=K))
    assert torch.equal(trainer.reward_heads, heads)
    plain = train_strategy("lpft", votes, str(tiny_model_dir), lpft_config(tuned_heads=False)).save(tmp_path / "p")
    assert not (plain / TUNED_HEADS_FILE).exists()
    assert score_heads(plain)[0] is None and "fits heads on its own features when [ppo] reads them" in \
        score_heads(plain)[1]


def test_the_trainer_refuses_a_penalty_without_heads(tiny_model_dir, tokenizer):
    from rlhf.models import load_causal_lm

    with pytest.raises(ValueError, match="needs the reward model's bootstrap heads.*given none"):
        PPOTrainer(load_causal_lm(tiny_model_dir), RewardModel.from_causal_lm(tiny_model_dir), tokenizer,
                   ppo_config(reward_spread_penalty=K), reward_model=RewardModel.from_causal_lm(tiny_model_dir),
                   reference=load_causal_lm(tiny_model_dir))


def test_an_lpft_round_with_a_spread_penalty_trains_ppo_on_its_tuned_heads(tmp_path, tiny_model_dir):
    from annotate.store import Store
    from loop.config_files import load_config
    from loop.round import run_round
    from tests.test_round import seed_votes, tiny_settings

    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["votes.strategy=lpft", "votes.n_heads=4",
                                                          "votes.finetune_epochs=1", "ppo.reward_spread_penalty=0.5"])
    run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    with Store(db) as store:
        metrics = store.rounds()[-1].metrics
    assert metrics["round/rm_strategy"] == "lpft"
    assert (Path(metrics["round/reward_model_path"]) / TUNED_HEADS_FILE).is_file()
    assert metrics["ppo/head_spread"] > 0  # PPO read the four heads' spread on the tuned features
