"""Incremental LP-FT (rlhf/reward/incremental.py, issue #33): a round continues the last round's LP-FT model on the
votes it has not trained on plus a replay share of earlier ones, so its cost follows the new votes."""

from dataclasses import replace

import torch

from rlhf.reward.data import PreferencePair, split_pairs
from rlhf.reward.incremental import pair_key, read_trained_pairs, replay_batch
from rlhf.reward.strategies import StrategyConfig, VotesConfig, train_strategy
from rlhf.reward.train import RewardTrainConfig
from tests.test_lpft import courteous_pairs


def _pair(i: int) -> PreferencePair:
    return PreferencePair(f"p{i}", f"good {i}", f"bad {i}")


def test_the_replay_batch_takes_every_new_vote_and_a_share_of_the_earlier_ones_by_hand():
    train = [_pair(i) for i in range(6)]
    seen = {pair_key(train[i]) for i in (0, 1, 3, 4)}
    batch = replay_batch(train, seen, replay_share=0.5, seed=7)
    assert batch.new == [2, 5]  # every pair the warm start never trained on
    assert len(batch.replay) == 1 and batch.replay[0] in (0, 1, 3, 4)  # round(0.5 x 2) of the earlier ones
    assert replay_batch(train, seen, 0.5, seed=7) == batch  # seeded
    assert sorted(replay_batch(train, seen, 10.0, seed=0).replay) == [0, 1, 3, 4]  # at most every earlier one
    assert replay_batch(train, seen, 0.0, seed=0).replay == []
    flipped = PreferencePair("p0", "bad 0", "good 0")  # the majority of pair 0 turned: a new vote to learn
    assert replay_batch([flipped] + train[1:], seen, 0.0, seed=0).new == [0, 2, 5]


def _config(**votes) -> StrategyConfig:
    reward = RewardTrainConfig(max_length=96, heldout_fraction=0.25, show_progress=False)
    votes = {"feature": "mean@2", "n_heads": 2, "cv_folds": 2, **votes}
    return StrategyConfig(votes=VotesConfig(**votes), reward=reward, seed=1)


def _top_layer(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.reward_model.backbone.layers[-1].state_dict().items()}


def test_a_second_round_continues_the_first_rounds_model_on_its_new_votes_and_a_replay(tmp_path, tiny_model_dir):
    votes = courteous_pairs(48)
    config = _config(finetune_epochs=2, incremental_epochs=1, replay_share=0.5)
    first = train_strategy("lpft", votes[:32], str(tiny_model_dir), config)
    assert first.metrics["rm/finetune_pairs"] == 2 * len(split_pairs(votes[:32], 0.25)[0])  # every vote, 2 passes
    folder = first.save(tmp_path / "round-1")
    assert read_trained_pairs(folder) == {pair_key(p) for p in split_pairs(votes[:32], 0.25)[0]}

    warm = replace(config, reward=replace(config.reward, warm_start=str(folder)))
    second = train_strategy("lpft", votes, str(tiny_model_dir), warm)
    n_new = len(split_pairs(votes, 0.25)[0]) - len(split_pairs(votes[:32], 0.25)[0])
    assert (second.metrics["rm/n_new"], second.metrics["rm/n_replay"]) == (n_new, round(0.5 * n_new))
    assert second.metrics["rm/finetune_pairs"] == n_new + round(0.5 * n_new)  # one pass over new and replayed
    assert second.metrics["rm/incremental"] is True

    # it started from the first round's fine-tuned layer: with a vanishing step it is that layer still
    still = replace(warm, votes=replace(warm.votes, finetune_lr=1e-12))
    unchanged = train_strategy("lpft", votes, str(tiny_model_dir), still)
    for name, tensor in _top_layer(first).items():
        torch.testing.assert_close(_top_layer(unchanged)[name], tensor, rtol=0, atol=1e-6)

    off = replace(warm, votes=replace(warm.votes, incremental=False))  # the team asked for full retrains
    full = train_strategy("lpft", votes, str(tiny_model_dir), off)
    assert "rm/incremental" not in full.metrics
    assert full.metrics["rm/finetune_pairs"] == 2 * len(split_pairs(votes, 0.25)[0])


def test_a_warm_start_of_another_feature_is_not_continued(tmp_path, tiny_model_dir):
    votes = courteous_pairs(40)
    folder = train_strategy("lpft", votes[:28], str(tiny_model_dir), _config(feature="mean@1")).save(tmp_path / "r1")
    config = _config()
    config = replace(config, reward=replace(config.reward, warm_start=str(folder)))
    model = train_strategy("lpft", votes, str(tiny_model_dir), config)  # mean@2 now: the old layer is not this one
    assert "rm/incremental" not in model.metrics
