"""LP-FT (rlhf/reward/lpft.py): the feature's top layers alone learn, from the probe, with the head's loss; the
"lpft" strategy saves a folder that scores as trained."""

import pytest
import torch
import torch.nn.functional as F

from rlhf.reward.data import PreferencePair, TokenizedPair, pad_pair_rows
from rlhf.reward.lpft import FinetuneSettings, finetune_top_layers
from rlhf.reward.model import RewardModel
from rlhf.reward.features import FeatureExtractor
from rlhf.reward.strategies import (
    StrategyConfig,
    TrainedPreferenceModel,
    VotesConfig,
    saved_strategy,
    score_with_reward_model,
    train_strategy,
)
from rlhf.reward.train import RewardTrainConfig


def courteous_pairs(n: int) -> list[PreferencePair]:
    topics = ["tomatoes", "bread", "the moon", "rivers", "tea", "maps"]
    return [PreferencePair(f"Tell me about {topics[i % 6]} #{i}.", f"Thank you, glad to help with {topics[i % 6]}.",
                           f"{topics[i % 6]} {i}. Facts only.") for i in range(n)]


def probe_of(tiny_model_dir, layer: int = 2, seed: int = 0) -> tuple[RewardModel, object]:
    """A mean-pooled reward model on the tiny model's first `layer` layers with a random head, and its tokenizer."""
    extractor = FeatureExtractor.from_model(str(tiny_model_dir))
    backbone = extractor.reward_model.backbone
    v_head = torch.nn.Linear(backbone.config.hidden_size, 1, bias=False)
    with torch.no_grad():
        v_head.weight.copy_(torch.randn(v_head.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return RewardModel(backbone, v_head, pooling="mean", layer=layer), extractor.tokenizer


def test_pair_rows_put_the_chosen_sequences_first_with_their_answer_masks():
    pairs = [TokenizedPair([1, 2], [3], [4, 5]), TokenizedPair([6], [7, 8], [9])]
    ids, mask, answer_mask = pad_pair_rows(pairs, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 0], [6, 7, 8, 0], [1, 2, 4, 5], [6, 9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert answer_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 0, 0]]


def test_the_loss_is_the_heads_graded_bradley_terry_loss(tiny_model_dir):
    # lr 0 leaves the weights as they are, so the first pass's mean loss is the loss of the probe itself:
    # sum_i w_i softplus(m_i - (r_c,i - r_r,i)) / sum_i w_i over one batch, worked out from the probe's scores
    probe, tokenizer = probe_of(tiny_model_dir)
    pairs = courteous_pairs(6)
    margins = torch.tensor([0.0, 4.0, 0.0, 4.0, 0.0, 0.0])
    weights = torch.tensor([1.0, 1.0, 2.0, 1.0, 1.0, 3.0])
    losses = []
    finetune_top_layers(probe, tokenizer, pairs, margins, weights, FinetuneSettings(lr=0.0, epochs=1, batch_pairs=8),
                        on_epoch=lambda epoch, loss, model: losses.append(loss))
    gap = (score_with_reward_model(probe, tokenizer, [p.prompt for p in pairs], [p.chosen for p in pairs])
           - score_with_reward_model(probe, tokenizer, [p.prompt for p in pairs], [p.rejected for p in pairs]))
    by_hand = float((weights * F.softplus(margins - gap)).sum() / weights.sum())
    assert losses == [pytest.approx(by_hand, rel=1e-4, abs=1e-6)]


@pytest.mark.parametrize("n_layers, learning", [(1, {"1"}), (2, {"0", "1"})])
def test_only_the_top_layers_learn_and_the_probe_is_left_as_it_was(tiny_model_dir, n_layers, learning):
    probe, tokenizer = probe_of(tiny_model_dir)
    before = {name: t.clone() for name, t in probe.state_dict().items()}
    pairs = courteous_pairs(12)
    losses = []
    tuned = finetune_top_layers(probe, tokenizer, pairs, torch.zeros(12), torch.ones(12),
                                FinetuneSettings(lr=1e-3, epochs=6, batch_pairs=4, n_layers=n_layers),
                                on_epoch=lambda epoch, loss, model: losses.append(loss))
    assert all(torch.equal(t, before[name]) for name, t in probe.state_dict().items())  # the probe is untouched
    after = tuned.state_dict()
    changed = {name for name, t in after.items() if not torch.equal(t.to(before[name].dtype), before[name])}
    assert all(name.startswith("backbone.layers.") for name in changed)  # not the embeddings, not the head
    assert {name.split(".")[2] for name in changed} == learning  # the top n_layers of the probe's 2, each moved
    assert not any(p.requires_grad for p in tuned.parameters())
    assert losses[-1] < losses[0]
    prompts = [p.prompt for p in pairs]
    gap_tuned = (score_with_reward_model(tuned, tokenizer, prompts, [p.chosen for p in pairs])
                 - score_with_reward_model(tuned, tokenizer, prompts, [p.rejected for p in pairs]))
    gap_probe = (score_with_reward_model(probe, tokenizer, prompts, [p.chosen for p in pairs])
                 - score_with_reward_model(probe, tokenizer, prompts, [p.rejected for p in pairs]))
    assert float(gap_tuned.mean()) > float(gap_probe.mean())  # the votes' chosen answers moved up


def test_lpft_strategy_saves_a_folder_that_scores_as_trained(tiny_model_dir, tmp_path):
    pairs = courteous_pairs(30)
    votes = VotesConfig(feature="mean@1", n_heads=4, cv_folds=3, finetune_lr=1e-3, finetune_epochs=2)
    config = StrategyConfig(votes=votes, reward=RewardTrainConfig(heldout_fraction=0.2, show_progress=False))
    model = train_strategy("lpft", pairs, str(tiny_model_dir), config)
    head = train_strategy("head", pairs, str(tiny_model_dir), config)
    assert model.weight is None and model.metrics["rm/strategy"] == "lpft"
    prompts = [p.prompt for p in pairs[:6]]
    answers = [p.chosen if i % 2 else p.rejected for i, p in enumerate(pairs[:6])]
    scores = model.score(prompts, answers)  # (6,)
    assert not torch.allclose(scores, head.score(prompts, answers), atol=1e-4)  # fine-tuning moved the scores
    path = model.save(tmp_path / "rm")
    assert saved_strategy(path) == "lpft"
    assert len(RewardModel.from_pretrained(path).backbone.layers) == 1  # mean@1: one decoder layer, as the head's
    loaded = TrainedPreferenceModel.load(path)
    torch.testing.assert_close(loaded.score(prompts, answers), scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loaded.heads, model.heads.float().double())  # on the frozen base features
    assert loaded.disagreement(prompts, answers, [p.rejected for p in pairs[:6]]).shape == (6,)


def test_a_feature_of_the_embeddings_has_no_layer_to_fine_tune_and_says_so(tiny_model_dir):
    probe, tokenizer = probe_of(tiny_model_dir, layer=0)
    with pytest.raises(ValueError, match="mean@1 or deeper"):
        finetune_top_layers(probe, tokenizer, courteous_pairs(2), torch.zeros(2), torch.ones(2),
                            FinetuneSettings(lr=1e-3, epochs=1))


def test_more_layers_than_the_feature_reads_is_refused_with_the_range(tiny_model_dir):
    probe, tokenizer = probe_of(tiny_model_dir, layer=2)
    with pytest.raises(ValueError, match="1 to 2 of them, not 3"):
        finetune_top_layers(probe, tokenizer, courteous_pairs(2), torch.zeros(2), torch.ones(2),
                            FinetuneSettings(lr=1e-3, epochs=1, n_layers=3))


@pytest.mark.parametrize("setting, message", [({"finetune_layers": 0}, "finetune_layers must be at least 1, not 0"),
                                              ({"finetune_epochs": 0}, "finetune_epochs must be at least 1, not 0"),
                                              ({"finetune_lr": 0.0}, "finetune_lr must be above 0")])
def test_lpft_settings_out_of_range_are_refused_by_name(setting, message):
    with pytest.raises(ValueError, match=message):
        VotesConfig(**setting)
