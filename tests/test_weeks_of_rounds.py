"""Six rounds of the tiny model (issue #33): after round 3, the reward stage's feature work and the checkpoint folder
stay flat. Counts, not clocks: the texts whose features a round computed, and the policy folders on disk."""

from pathlib import Path

from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from loop.config_files import load_config
from loop.round import run_round
from tests.test_round import seed_votes, tiny_settings

ROUNDS = 6


def _texts(preferences) -> set[tuple[str, str]]:
    return {(p.prompt, answer) for p in preferences for answer in (p.chosen, p.rejected)}


def test_six_rounds_compute_features_only_for_new_answers_and_keep_a_bounded_folder(tmp_path, tiny_model_dir):
    db = tmp_path / "weeks.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["round.min_new_pairs=1", "round.keep_policies=2",
                                                          "round.report_prompts=0", "round.next_pairs=8"],
                         default_file=None)
    root = tmp_path / "checkpoints" / "weeks"
    computed, new_texts, folders = [], [], []
    seen: set[tuple[str, str]] = set()
    for number in range(ROUNDS):
        with Store(db) as store:
            texts = _texts(store.preferences())
        result = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
        computed.append(result.metrics["rm/features_computed"])
        new_texts.append(len(texts - seen))
        seen |= texts
        folders.append(len(list(root.glob("round-*/policy"))))
        with Store(db) as store:
            simulate_votes(store, resolve_judge("longer"), f"sim{number}", n_votes=store.pairs_waiting())

    assert computed == new_texts  # each round paid for its new answers only, never for the earlier votes again
    assert computed[-1] < len(seen) - new_texts[-1]  # the last round alone would have recomputed more than this
    assert max(folders[2:]) <= 3 and folders[2:] == [folders[2]] * (ROUNDS - 2)  # K=2, at most the best beside
    with Store(db) as store:
        assert [r.status for r in store.rounds()] == ["done"] * ROUNDS
        named = [p for p in store.policies() if p.round > 0 and not p.pruned]
        assert named and all((Path(p.path) / "config.json").is_file() for p in named)  # every named one loads
