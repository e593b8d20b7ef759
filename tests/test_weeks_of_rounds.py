"""Six rounds of the tiny model (issue #33): after round 3, the reward stage's feature work, its fine-tuning and the
checkpoint folder stay flat. Counts, not clocks: the texts whose features a round computed, the pairs LP-FT trained on
(times its passes), and the policy folders on disk."""

from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from loop.config_files import load_config
from loop.round import run_round
from rlhf.models import load_causal_lm
from tests.test_round import seed_votes, tiny_settings

ROUNDS = 6


def _texts(preferences) -> set[tuple[str, str]]:
    return {(p.prompt, answer) for p in preferences for answer in (p.chosen, p.rejected)}


def test_six_rounds_compute_features_only_for_new_answers_and_keep_a_bounded_folder(tmp_path, tiny_model_dir):
    db = tmp_path / "weeks.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["round.min_new_pairs=1", "round.keep_policies=2",
                                                          "round.report_prompts=0", "round.next_pairs=8",
                                                          "votes.strategy=lpft"],
                         default_file=None)
    root = tmp_path / "checkpoints" / "weeks"
    computed, new_texts, folders, finetuned = [], [], [], []
    seen: set[tuple[str, str]] = set()
    for number in range(ROUNDS):
        with Store(db) as store:
            texts = _texts(store.preferences())
        result = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
        computed.append(result.metrics["rm/features_computed"])
        finetuned.append({k: result.metrics.get(f"rm/{k}") for k in ("finetune_pairs", "n_new", "n_replay", "n_train")})
        new_texts.append(len(texts - seen))
        seen |= texts
        folders.append(len(list(root.glob("round-*/policy"))))
        with Store(db) as store:
            simulate_votes(store, resolve_judge("longer"), f"sim{number}", n_votes=store.pairs_waiting())

    assert computed == new_texts  # each round paid for its new answers only, never for the earlier votes again
    assert computed[-1] < len(seen) - new_texts[-1]  # the last round alone would have recomputed more than this
    votes = config.votes
    assert finetuned[0]["n_new"] is None  # round 1: LP-FT from the probe on every vote
    for row in finetuned[1:]:  # later rounds: the new votes and at most as many replayed, a few passes
        assert row["finetune_pairs"] == (row["n_new"] + row["n_replay"]) * votes.incremental_epochs
        assert row["n_replay"] == min(round(votes.replay_share * row["n_new"]), row["n_train"] - row["n_new"])
    assert finetuned[-1]["finetune_pairs"] < finetuned[-1]["n_train"] * votes.finetune_epochs  # a full retrain's
    assert max(folders[2:]) <= 3 and folders[2:] == [folders[2]] * (ROUNDS - 2)  # K=2, at most the best beside
    with Store(db) as store:
        assert [r.status for r in store.rounds()] == ["done"] * ROUNDS
        named = [p for p in store.policies() if p.round > 0 and not p.pruned]
    assert named
    for policy in named:  # every policy the database still names loads, with the weights it was saved with
        model = load_causal_lm(policy.path)
        assert model.config.vocab_size > 0 and next(model.parameters()).isfinite().all()
