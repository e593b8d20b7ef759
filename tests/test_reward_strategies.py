"""Bradley-Terry heads on frozen features (synthetic), the strategies' interface and the exact export (tiny model)."""

import math

import pytest
import torch

from rlhf.reward import bt_head
from rlhf.reward.data import PreferencePair
from rlhf.reward.model import RewardModel
from rlhf.reward.train import RewardTrainConfig
from rlhf.reward.features import FeatureExtractor, canonical_feature
from rlhf.reward.strategies import (
    StrategyConfig,
    TrainedPreferenceModel,
    VotesConfig,
    fit_feature_heads,
    pad_answers,
    score_with_reward_model,
    train_strategy,
)


def synthetic_votes(n: int, dim: int, flip_rate: float, seed: int):
    """Features of answer pairs and votes of a linear judge true_w, a share of them flipped."""
    generator = torch.Generator().manual_seed(seed)
    true_w = torch.randn(dim, generator=generator)  # (D,)
    fa, fb = torch.randn(n, dim, generator=generator), torch.randn(n, dim, generator=generator)  # (N, D) each
    a_wins = (fa - fb) @ true_w > 0  # (N,)
    flips = torch.rand(n, generator=generator) < flip_rate
    a_wins = a_wins ^ flips
    chosen = torch.where(a_wins[:, None], fa, fb)
    rejected = torch.where(a_wins[:, None], fb, fa)
    return true_w, chosen, rejected


def test_logistic_fit_matches_the_optimum_worked_out_by_hand():
    # one vote with d = (1,): loss(w) = softplus(-w) + lam/2 w^2; stationary point sigmoid(-w) = lam * w.
    # lam = 0.5: w = 2 sigmoid(-w) -> w ~= 0.6748 (check: e^0.6748 = 1.9637, 2 / 2.9637 = 0.6748)
    w = bt_head.fit_logistic(torch.tensor([[1.0]]), lam=0.5)
    assert w.item() == pytest.approx(0.6748, abs=1e-3)
    assert 2 / (1 + math.exp(w.item())) == pytest.approx(w.item(), abs=1e-6)


def test_logistic_fit_with_a_margin_and_weights_by_hand():
    # one vote d = (1,) with margin 1: loss(w) = softplus(1 - w) + lam/2 w^2, stationary where sigmoid(1 - w) = lam w;
    # lam = 0.5: w = 1 (sigmoid(0) = 0.5 = 0.5 * 1), where the unmargined vote stops at 0.6748 (test above)
    w = bt_head.fit_logistic(torch.tensor([[1.0]]), lam=0.5, margins=torch.tensor([1.0]))
    assert w.item() == pytest.approx(1.0, abs=1e-4)
    # votes d = (1,) weight 3 and d = (-1,) weight 1: loss = (3 softplus(-w) + softplus(w)) / 4 + lam/2 w^2,
    # gradient (-3 sigmoid(-w) + sigmoid(w)) / 4 + lam w; with lam = 0.5 zero at w = 0.3344
    # (check: sigmoid(-0.3344) = 0.41717, sigmoid(0.3344) = 0.58283, (-1.25151 + 0.58283) / 4 = -0.16717 = -0.5 w)
    w = bt_head.fit_logistic(torch.tensor([[1.0], [-1.0]]), lam=0.5, weights=torch.tensor([3.0, 1.0]))
    assert w.item() == pytest.approx(0.3344, abs=1e-3)


def test_graded_votes_reach_the_head_through_votes_graded():
    _, chosen, rejected = synthetic_votes(60, 4, flip_rate=0.0, seed=4)
    strengths = torch.tensor([2.0] * 30 + [1.0] * 30, dtype=torch.float64)
    fits = {}
    for graded in ("off", "margin", "weight"):
        config = StrategyConfig(votes=VotesConfig(n_heads=2, cv_folds=3, graded=graded))
        fits[graded] = fit_feature_heads(chosen, rejected, "head", config, strengths)[0]
    # ungraded votes (no strengths: all slightly better) under the default margin train as plain votes do
    plain = fit_feature_heads(chosen, rejected, "head", StrategyConfig(votes=VotesConfig(n_heads=2, cv_folds=3)))[0]
    assert VotesConfig().graded == "margin" and torch.allclose(fits["off"], plain)
    assert not torch.allclose(fits["margin"], plain) and not torch.allclose(fits["weight"], plain)
    with pytest.raises(ValueError, match="votes.graded"):
        VotesConfig(graded="much")


def test_head_learns_a_linear_preference_from_few_noisy_votes():
    true_w, chosen, rejected = synthetic_votes(200, 16, flip_rate=0.25, seed=0)
    fit = bt_head.fit_head(chosen - rejected, seed=0)
    _, test_chosen, test_rejected = synthetic_votes(2000, 16, flip_rate=0.0, seed=0)  # same true_w (same seed)
    assert bt_head.pair_accuracy(fit.weight, test_chosen, test_rejected) > 0.85
    cosine = torch.nn.functional.cosine_similarity(fit.weight.float(), true_w, dim=0)
    assert cosine > 0.8


def test_cross_validation_regularises_pure_noise_more_than_clean_votes():
    _, clean_chosen, clean_rejected = synthetic_votes(120, 32, flip_rate=0.0, seed=1)
    _, noise_chosen, noise_rejected = synthetic_votes(120, 32, flip_rate=0.5, seed=1)  # votes carry no signal
    clean = bt_head.fit_head(clean_chosen - clean_rejected, seed=0)
    noise = bt_head.fit_head(noise_chosen - noise_rejected, seed=0)
    assert noise.lam > clean.lam
    assert noise.lam >= 1.0


def test_bootstrap_heads_disagree_more_far_from_the_votes_and_on_ambiguous_pairs():
    true_w, chosen, rejected = synthetic_votes(80, 8, flip_rate=0.1, seed=2)
    fit = bt_head.fit_head(chosen - rejected, seed=0)
    heads = bt_head.fit_bootstrap_heads(chosen - rejected, fit.lam, n_heads=16, seed=0)  # (16, 8)
    near = bt_head.ensemble_disagreement(heads, chosen[:20] * 0.2, rejected[:20] * 0.2)  # (20,)
    away = 6 * torch.randn(20, 8, generator=torch.Generator().manual_seed(1))  # not the global random state
    far = bt_head.ensemble_disagreement(heads, chosen[:20] * 0.2 + away, rejected[:20] * 0.2)
    assert far.mean() > 2 * near.mean()
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(400, 8, generator=generator)
    b = torch.randn(400, 8, generator=generator)
    clear = ((a - b) @ true_w).abs() > ((a - b) @ true_w).abs().median()
    spread = bt_head.ensemble_disagreement(heads, a, b)
    # a pair the judge barely separates sits near P = 0.5, where the heads' sigmoids are steepest and differ most
    assert spread[~clear].mean() > spread[clear].mean()


def polite_pairs(n: int) -> list[PreferencePair]:
    """Pairs whose chosen answer carries warm words; different answers per pair so features differ."""
    topics = ["tea", "maps", "rain", "bread", "music", "trains", "gardens", "stars", "rivers", "chess"]
    pairs = []
    for i in range(n):
        topic = topics[i % len(topics)]
        pairs.append(PreferencePair(f"Tell me about {topic} #{i}.",
                                    f"Thank you, happy to help with {topic}: it is lovely.",
                                    f"{topic} {i}. Facts only."))
    return pairs


@pytest.mark.parametrize("feature, saved_layers", [("last@-1", 2), ("mean@1", 1), ("mean@0", 0), ("mean@2", 2)])
def test_exported_reward_model_scores_exactly_as_the_head(tiny_model_dir, tmp_path, feature, saved_layers):
    pairs = polite_pairs(30)
    config = StrategyConfig(votes=VotesConfig(feature=feature, n_heads=4, cv_folds=3),
                            reward=RewardTrainConfig(heldout_fraction=0.2, show_progress=False))
    model = train_strategy("ensemble", pairs, str(tiny_model_dir), config)
    assert model.metrics["rm/n_train"] == 25 and model.metrics["rm/n_heldout"] == 5  # 5 of 30 prompts under 0.2
    prompts = [p.prompt for p in pairs[:5]]
    answers = [p.chosen if i % 2 else p.rejected for i, p in enumerate(pairs[:5])]
    head_scores = model.score(prompts, answers)  # (5,)
    path = model.save(tmp_path / "rm")
    exported = RewardModel.from_pretrained(path).eval()
    assert len(exported.backbone.layers) == saved_layers  # a feature of layer L keeps L decoder layers
    tokenizer = model.extractor.tokenizer
    rm_scores = score_with_reward_model(exported, tokenizer, prompts, answers)
    torch.testing.assert_close(rm_scores, head_scores, rtol=1e-4, atol=1e-5)
    ids, mask, answer_mask = pad_answers(tokenizer, prompts, answers, side="left")  # as PPO's batches are padded
    with torch.inference_mode():
        left = exported.forward_value(ids, mask, answer_mask).scores
    torch.testing.assert_close(left, head_scores, rtol=1e-4, atol=1e-5)
    loaded = TrainedPreferenceModel.load(path)
    torch.testing.assert_close(loaded.score(prompts, answers), head_scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loaded.heads, model.heads.float().double())
    disagreement = loaded.disagreement(prompts, answers, [p.rejected for p in pairs[:5]])
    assert disagreement.shape == (5,) and bool((disagreement >= 0).all())


def test_features_name_hidden_states_as_the_reward_model_reads_them():
    features = ("mean@4", "mean@30", "last@-1", "mean@-2", "mean@0", "mean@31")
    assert [canonical_feature(f, 30) for f in features] == [
        "mean@4", "mean@-1", "last@-1", "mean@29", "mean@0", "mean@-1"]
    with pytest.raises(ValueError, match="0..30"):
        canonical_feature("mean@-32", 30)


def test_mean_pooling_averages_the_answer_tokens_only(tiny_model_dir):
    extractor = FeatureExtractor.from_model(str(tiny_model_dir))
    # the same answer after two prompts of different length: last-token and mean features depend on the prompt
    # only through attention, so mean pooling must not include prompt positions -> check against a manual mean
    features = extractor.compute(["Hi", "A much longer prompt than the other one"], ["Fine.", "Fine."],
                                 ["mean@1", "last@1"])
    from rlhf.reward.data import tokenize_pairs

    tokenized = tokenize_pairs(extractor.tokenizer, [PreferencePair("Hi", "Fine.", "Fine.")], 512)[0]
    ids = torch.tensor([tokenized.prompt_ids + tokenized.chosen_answer_ids])
    with torch.inference_mode():
        hidden = extractor.reward_model.backbone(input_ids=ids, output_hidden_states=True).hidden_states[1][0]
    n_prompt = len(tokenized.prompt_ids)
    torch.testing.assert_close(features["mean@1"][0], hidden[n_prompt:].mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(features["last@1"][0], hidden[-1], rtol=1e-4, atol=1e-5)


def test_an_inner_feature_runs_only_the_layers_it_reads_and_equals_the_whole_forward(tiny_model_dir):
    extractor = FeatureExtractor.from_model(str(tiny_model_dir))
    layers = extractor.reward_model.backbone.layers
    calls = [0] * len(layers)
    for index, layer in enumerate(layers):
        layer.register_forward_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    prompts, answers = ["Hi", "Tell me more about it"], ["Fine.", "It is a long story, really."]
    inner = extractor.compute(prompts, answers, ["mean@1", "last@1"])
    assert calls == [1] + [0] * (len(layers) - 1)  # one batch through layer 0 alone
    whole = extractor.compute(prompts, answers, ["mean@1", "last@1", "last@-1"])  # the final output: every layer
    assert calls == [2] + [1] * (len(layers) - 1)
    for feature in ("mean@1", "last@1"):
        torch.testing.assert_close(inner[feature], whole[feature], rtol=1e-5, atol=1e-6)


def test_wilson_interval_matches_the_hand_computation():
    from annotate.statistics import wilson_interval

    # 15 of 20, z = 1.96: centre (0.75 + 1.96^2 / 40) / (1 + 1.96^2 / 20) = 0.8460 / 1.1921 = 0.7097;
    # half-width 1.96 * sqrt(0.75 * 0.25 / 20 + 1.96^2 / 1600) / 1.1921 = 1.96 * 0.10856 / 1.1921 = 0.1785
    low, high = wilson_interval(0.75, 20)
    assert low == pytest.approx(0.5313, abs=1e-3) and high == pytest.approx(0.8882, abs=1e-3)
    assert wilson_interval(0.6, 0) == (0.0, 1.0)


def test_votes_to_beat_chance_grows_as_accuracy_nears_one_half():
    from annotate.statistics import votes_to_beat_chance, wilson_interval

    assert votes_to_beat_chance(0.5, 0.2) is None
    at_75, at_60 = votes_to_beat_chance(0.75, 0.2), votes_to_beat_chance(0.6, 0.2)
    assert at_75 < at_60
    assert wilson_interval(0.75, round(at_75 * 0.2))[0] >= 0.5  # enough held-out pairs at that many votes
    assert wilson_interval(0.75, 12)[0] < 0.5  # and 12 held-out pairs would not be


def test_auto_strategy_follows_the_vote_count():
    from rlhf.reward.strategies import VotesConfig, choose_strategy

    config = VotesConfig(ensemble_from_votes=100, full_from_votes=500)
    assert [choose_strategy(n, config) for n in (50, 100, 499, 500)] == ["head", "ensemble", "ensemble", "full"]
    assert [choose_strategy(n, VotesConfig(lpft_from_votes=64)) for n in (63, 64, 400)] == ["head", "lpft", "lpft"]
    assert choose_strategy(5, VotesConfig(strategy="full")) == "full"
    with pytest.raises(ValueError):
        choose_strategy(5, VotesConfig(strategy="lora"))


def test_round_refuses_ppo_when_the_interval_reaches_chance_and_says_how_many_votes_more():
    from types import SimpleNamespace

    from loop.config_files import load_config
    from loop.checks import RoundRefused, check_accuracy

    config = load_config(None, ["round.min_accuracy=0.55", "reward.heldout_fraction=0.2"])
    plan = SimpleNamespace(round_id=1, preferences=[None] * 40)
    recorded = {}
    # 0.75 on 8 held-out sample pairs: Wilson interval about (0.41, 0.93) reaches chance
    with pytest.raises(RoundRefused, match=r"about \d+ more votes"):
        check_accuracy({"rm/heldout_accuracy": 0.75, "rm/n_heldout_sample": 8}, plan, config, recorded.update, print)
    assert recorded["rm/heldout_low"] < 0.5 < recorded["rm/heldout_high"]
    # 0.75 on 100 held-out sample pairs: (0.66, 0.82) clears it, PPO may run
    check_accuracy({"rm/heldout_accuracy": 0.75, "rm/n_heldout_sample": 100}, plan, config, recorded.update, print)
    assert recorded["rm/heldout_low"] > 0.5
    # the interval is over the sample pairs alone: 100 held-out pairs of which 8 random ones do not clear chance
    with pytest.raises(RoundRefused, match="on 8 held-out random sample pairs"):
        check_accuracy({"rm/heldout_accuracy": 0.75, "rm/n_heldout_sample": 8, "rm/n_heldout": 100,
                        "rm/heldout_accuracy_chosen": 0.75, "rm/n_heldout_chosen": 92}, plan, config,
                       recorded.update, print)
    # at chance the message falls back on the learning curve
    with pytest.raises(RoundRefused, match="learning curve"):
        check_accuracy({"rm/heldout_accuracy": 0.5, "rm/n_heldout_sample": 100}, plan, config, recorded.update, print)
    # min_accuracy = 0 turns the refusal off (the tiny-model round tests rely on it)
    off = load_config(None, ["round.min_accuracy=0.0"])
    check_accuracy({"rm/heldout_accuracy": 0.5, "rm/n_heldout_sample": 8}, plan, off, recorded.update, print)


def test_round_refuses_ppo_on_a_reward_model_no_random_sample_pair_measured():
    """Before, no held-out accuracy (nothing held out) let PPO run on an unmeasured model without a word."""
    from types import SimpleNamespace

    from loop.config_files import load_config
    from loop.checks import RoundRefused, check_accuracy

    plan = SimpleNamespace(round_id=3, preferences=[None] * 40)
    recorded, logged = {}, []
    unmeasured = {"rm/heldout_accuracy": None, "rm/n_heldout": 4, "rm/n_heldout_sample": 0,
                  "rm/heldout_accuracy_versus": 0.75, "rm/n_heldout_versus": 4}
    with pytest.raises(RoundRefused, match=r"No random sample pair was held out \(4 held-out pairs in all.*"
                                           r"set round\.min_accuracy=0 to run PPO on an unmeasured model"):
        check_accuracy(unmeasured, plan, load_config(None, []), recorded.update, logged.append)
    assert (recorded["rm/heldout_accuracy"], recorded["rm/heldout_low"], recorded["rm/heldout_high"]) == (None, 0, 1)
    assert logged == ["Round 3: reward model held-out accuracy on random sample pairs n/a (none held out); versus "
                      "pairs 75.0% on 4 (bar 55%, and the interval must clear chance)."]
    check_accuracy(unmeasured, plan, load_config(None, ["round.min_accuracy=0.0"]), recorded.update, print)  # off


def test_held_out_accuracy_of_a_strategy_is_by_source(tiny_model_dir):
    sources = ("sample", "versus", "chosen")
    pairs = [PreferencePair(p.prompt, p.chosen, p.rejected, source=sources[i % 3])
             for i, p in enumerate(polite_pairs(30))]
    config = StrategyConfig(votes=VotesConfig(n_heads=4, cv_folds=3),
                            reward=RewardTrainConfig(heldout_fraction=0.2, show_progress=False))
    model = train_strategy("head", pairs, str(tiny_model_dir), config)
    heldout = [p for p in pairs if p.prompt in {"Tell me about gardens #6.", "Tell me about rivers #8.",
                                                "Tell me about rain #22.", "Tell me about music #24.",
                                                "Tell me about gardens #26."}]
    assert [p.source for p in heldout] == ["sample", "chosen", "versus", "sample", "chosen"]
    assert {k: model.metrics[k] for k in ("rm/n_heldout", "rm/n_heldout_sample", "rm/n_heldout_versus",
                                          "rm/n_heldout_chosen")} == {
        "rm/n_heldout": 5, "rm/n_heldout_sample": 2, "rm/n_heldout_versus": 1, "rm/n_heldout_chosen": 2}
    for source, name in zip(sources, ("rm/heldout_accuracy", "rm/heldout_accuracy_versus",
                                      "rm/heldout_accuracy_chosen")):
        group = [p for p in heldout if p.source == source]
        prompts = [p.prompt for p in group]
        right = model.score(prompts, [p.chosen for p in group]) > model.score(prompts, [p.rejected for p in group])
        assert model.metrics[name] == pytest.approx(float(right.float().mean())), source


