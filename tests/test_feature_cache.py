"""The reward stage's features kept on disk between rounds (rlhf.reward.feature_cache, issue #33): a round computes
features only for answers no earlier round saw, and the cached ones equal what the model computes."""

import os

import torch

from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from loop.config_files import load_config
from loop.round import run_round
from rlhf.reward.feature_cache import FeatureFile, model_fingerprint, text_key
from rlhf.reward.features import FeatureExtractor
from tests.test_round import seed_votes, tiny_settings

PROMPTS = ["What is a river?", "Name a colour.", "Say hello."]
ANSWERS = ["Water that flows.", "Blue.", "Hello there!"]


def test_a_feature_file_keeps_what_was_added_and_reads_it_back(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    stored = FeatureFile(tmp_path / "cache", model, "mean@2", 64)
    stored.add({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])})
    stored.add({"c": torch.tensor([5.0, 6.0])})
    again = FeatureFile(tmp_path / "cache", model, "mean@2", 64)
    assert len(again) == 3
    got = again.get(["c", "a", "never"])
    assert set(got) == {"a", "c"} and torch.equal(got["c"], torch.tensor([5.0, 6.0]))
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [again.path.name]  # no temporary file left
    assert FeatureFile(tmp_path / "cache", model, "mean@2", 128).path != again.path  # another max_length: another file
    before = model_fingerprint(model)
    os.utime(model / "model.safetensors", ns=(1, 1))  # the model was replaced at the same path
    assert model_fingerprint(model) != before
    assert len(FeatureFile(tmp_path / "cache", model, "mean@2", 64)) == 0
    assert text_key("a", "bc") != text_key("ab", "c")


def test_a_second_extractor_reads_the_features_instead_of_computing_them(tmp_path, tiny_model_dir):
    first = FeatureExtractor.from_model(str(tiny_model_dir), max_length=64, cache_folder=tmp_path / "cache")
    computed = first.features(PROMPTS, ANSWERS, "mean@1")  # (3, D)
    assert (first.computed, first.reused) == (3, 0)
    second = FeatureExtractor.from_model(str(tiny_model_dir), max_length=64, cache_folder=tmp_path / "cache")
    again = second.features(PROMPTS[:2] + ["A new prompt?"], ANSWERS[:2] + ["A new answer."], "mean@1")
    assert (second.computed, second.reused) == (1, 2)
    assert torch.equal(again[:2], computed[:2])
    fresh = FeatureExtractor.from_model(str(tiny_model_dir), max_length=64)  # no cache: the model itself
    assert torch.allclose(fresh.features(["A new prompt?"], ["A new answer."], "mean@1"), again[2:], atol=1e-6)


def _distinct_texts(preferences) -> set[tuple[str, str]]:
    return {(p.prompt, answer) for p in preferences for answer in (p.chosen, p.rejected)}


def test_the_second_round_computes_features_only_for_the_new_answers(tmp_path, tiny_model_dir):
    db = tmp_path / "cache.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["round.min_new_pairs=1", "round.report_prompts=0"],
                         default_file=None)
    store = Store(db)
    seen = _distinct_texts(store.preferences())
    first = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    assert (first.metrics["rm/features_computed"], first.metrics["rm/features_reused"]) == (len(seen), 0)

    simulate_votes(store, resolve_judge("longer"), "sim2", n_votes=6)
    now = _distinct_texts(store.preferences())
    assert now - seen, "the new votes brought no new answers"
    second = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    assert second.metrics["rm/features_computed"] == len(now - seen)
    assert second.metrics["rm/features_reused"] == len(now & seen)
    assert (tmp_path / "checkpoints" / "cache" / "features").is_dir()
