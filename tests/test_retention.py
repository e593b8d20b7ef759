"""Bounded disk (loop.retention, round.keep_policies): the keep/delete rule on tables worked by hand, the store's
pruned mark, `--prune [--dry-run]`, readers that refuse a pruned policy in a sentence, and four tiny rounds that keep
one policy and still complete."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlite_utils

import app
from annotate.disk import (CEILING_POLICY, POLICY, REWARD_MODEL, disk_line, folder_bytes, is_inside,
                           named_checkpoints, size_text)
from annotate.records import Policy, Round, WinRate
from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from annotate.store.sql import MIGRATIONS
from loop.config_files import load_config
from loop.pair_request import PairRequest, earlier_policy
from loop.retention import (PolicyPruned, best_win_rate, delete_checkpoint, loadable_path, prune_checkpoints,
                            retention_plan)
from loop.round import run_round
from loop.round_lock import RoundLock
from tests.test_round import seed_votes, tiny_settings

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path("/ck/loop")


def policy(policy_id: int, round_: int, parent: int | None, pruned_at: str | None = None) -> Policy:
    """Policy `policy_id` of round `round_`, saved in round `round_`'s folder (round 0: the base, "default")."""
    path = "default" if round_ == 0 else str(ROOT / f"round-{round_}" / "policy")
    return Policy(policy_id, round_, path, parent, "t", pruned_at)


def done_round(round_id: int, status: str = "done", **metrics) -> Round:
    """Round `round_id`, which started from policy `round_id` and saved policy `round_id + 1` and its reward model in
    its folder, unless `metrics` says otherwise."""
    folder = ROOT / f"round-{round_id}"
    recorded = {"round/policy_id": round_id + 1, "round/actor_policy_id": round_id,
                "round/reward_model_path": str(folder / "reward"), **metrics}
    return Round(id=round_id, status=status, started_at="t", finished_at="t", metrics=recorded,
                 error=None, pid=None)


def decisions_by_label(decisions) -> dict[str, tuple[bool, str]]:
    return {d.checkpoint.label: (d.keep, d.reason) for d in decisions}


def five_rounds_and_a_crash():
    """Policies 1 (base) to 6 (round r saves policy r + 1), an SFT model recorded at round 0 inside the checkpoint
    folder, round 1's oracle ceiling, round 6 failed after its reward model; people's versus votes."""
    policies = [policy(1, 0, None)] + [policy(r + 1, r, r) for r in range(1, 6)]
    policies.append(Policy(7, 0, str(ROOT / "sft"), 1, "t"))
    rounds = [done_round(1, **{"round/ceiling_policy_path": str(ROOT / "round-1" / "ceiling-policy")})]
    rounds += [done_round(r) for r in range(2, 6)]
    rounds.append(Round(id=6, status="failed", started_at="t", finished_at="t", error="killed", pid=None,
                        metrics={"round/actor_policy_id": 6, "round/reward_model_path": str(ROOT / "round-6/reward")}))
    win_rates = [
        WinRate(2, 1, wins=9, losses=1),  # 90% of 10: Wilson lower bound 0.596
        WinRate(3, 2, wins=14, losses=2),  # 87.5% of 16: lower bound 0.640, the highest: the best
        WinRate(4, 3, wins=5),  # 100% of 5: too few judged votes
        WinRate(5, 4, wins=6, losses=6),  # 50% of 12: not above one half
    ]
    return policies, rounds, win_rates


def test_the_keep_rule_on_a_table_worked_by_hand():
    policies, rounds, win_rates = five_rounds_and_a_crash()
    checkpoints = named_checkpoints(policies, rounds, ROOT)
    got = decisions_by_label(retention_plan(checkpoints, policies, rounds, win_rates, keep_policies=1))
    kept = sorted(label for label, (keep, _reason) in got.items() if keep)
    assert kept == ["policy 3 (round-2/policy)", "policy 5 (round-4/policy)", "policy 6 (round-5/policy)",
                    "reward model of round 2 (round-2/reward)", "reward model of round 4 (round-4/reward)",
                    "reward model of round 5 (round-5/reward)", "reward model of round 6 (round-6/reward)"]
    assert sorted(label for label, (keep, _reason) in got.items() if not keep) == [
        "ceiling policy of round 1 (round-1/ceiling-policy)", "policy 2 (round-1/policy)",
        "policy 4 (round-3/policy)", "reward model of round 1 (round-1/reward)",
        "reward model of round 3 (round-3/reward)"]
    assert got["policy 6 (round-5/policy)"][1] == (
        "the current policy: the next round and the app's pairs start from it; one of the last 1 policies "
        "(round.keep_policies); saved by the last finished round (5); round 6 (failed, after the last finished one) "
        "names it: a resumed round reads it")
    assert got["policy 5 (round-4/policy)"][1] == (
        "the current policy's parent: its versus pairs are set against it; the last finished round (5) started from it")
    assert got["policy 3 (round-2/policy)"][1] == (
        "the best by people's votes: 88% against policy 2 over 16 judged votes (95% lower bound 64%)")
    assert got["reward model of round 5 (round-5/reward)"][1] == (
        "the last finished round's (5) reward model: the next round starts from it and picks the next pairs with it; "
        "made with policy 6, which is kept")
    assert got["reward model of round 6 (round-6/reward)"][1] == (
        "round 6 (failed, after the last finished one) names it: a resumed round reads it")
    assert got["policy 4 (round-3/policy)"][1] == (
        "neither current nor its parent, not one of the last 1, not the best by votes, and no round that needs it "
        "names it")
    assert got["reward model of round 1 (round-1/reward)"][1] == (
        "made with no kept policy, and no round that needs it names it")
    # the base ("default") and the SFT model (round 0, inside the folder) are never checkpoints of ours
    assert {c.kind for c in checkpoints} == {POLICY, REWARD_MODEL, CEILING_POLICY}
    assert not any("sft" in c.path or c.path.endswith("default") for c in checkpoints)


def test_more_kept_policies_keep_more_and_zero_keeps_everything():
    policies, rounds, win_rates = five_rounds_and_a_crash()
    checkpoints = named_checkpoints(policies, rounds, ROOT)
    three = decisions_by_label(retention_plan(checkpoints, policies, rounds, win_rates, keep_policies=3))
    assert three["policy 4 (round-3/policy)"] == (True, "one of the last 3 policies (round.keep_policies)")
    assert three["policy 2 (round-1/policy)"][0] is False
    everything = retention_plan(checkpoints, policies, rounds, win_rates, keep_policies=0)
    assert all(d.keep and d.reason == "round.keep_policies is 0: every checkpoint is kept" for d in everything)


def test_a_running_rounds_references_are_kept_and_a_pruned_policy_left_on_disk_goes():
    policies = [policy(1, 0, None)] + [policy(r + 1, r, r) for r in range(1, 4)]
    policies[1] = policy(2, 1, 1, pruned_at="2024-01-01T00:00:00Z")  # pruned, but its folder is still there
    running = Round(id=4, status="running", started_at="t", finished_at=None, error=None, pid=123, metrics={
        "round/actor_policy_id": 3, "round/reward_model_path": str(ROOT / "round-1" / "reward")})
    rounds = [done_round(1), done_round(2), done_round(3), running]
    got = decisions_by_label(retention_plan(named_checkpoints(policies, rounds, ROOT), policies, rounds, [], 1))
    assert got["policy 3 (round-2/policy)"] == (True, "the current policy's parent: its versus pairs are set against "
                                                "it; the last finished round (3) started from it; round 4 (running, "
                                                "after the last finished one) names it: a resumed round reads it")
    assert got["reward model of rounds 1, 4 (round-1/reward)"] == (
        True, "round 4 (running, after the last finished one) names it: a resumed round reads it")
    assert got["policy 2 (round-1/policy)"] == (False, "pruned before: its folder was left behind")
    assert got["reward model of round 2 (round-2/reward)"] == (True, "made with policy 3, which is kept")


def test_best_is_the_highest_lower_bound_among_enough_votes_above_one_half_and_never_a_pruned_one():
    policies, _rounds, win_rates = five_rounds_and_a_crash()
    assert best_win_rate(win_rates, policies).policy_id == 3
    assert best_win_rate(win_rates[:1], policies).policy_id == 2
    assert best_win_rate(win_rates[2:], policies) is None  # too few votes, or not beyond chance
    assert best_win_rate([], policies) is None
    policies[2] = policy(3, 2, 2, pruned_at="t")
    assert best_win_rate(win_rates, policies).policy_id == 2  # the best whose folder is still there


def test_nothing_outside_the_databases_folder_is_a_checkpoint_or_deleted(tmp_path):
    root = tmp_path / "checkpoints" / "loop"
    assert is_inside(root / "round-1" / "policy", root) and not is_inside(root, root)
    assert not is_inside(tmp_path / "checkpoints" / "loop2" / "round-1", root)
    assert not is_inside(root / ".." / "other" / "policy", root)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    policies = [Policy(1, 0, "default", None, "t"), Policy(2, 1, str(outside), 1, "t")]
    assert named_checkpoints(policies, [], root) == []
    from loop.retention import Decision
    from annotate.disk import Checkpoint

    with Store() as store, pytest.raises(ValueError, match="outside"):
        delete_checkpoint(store, Decision(Checkpoint(str(outside), POLICY, (), frozenset({2})), False, "x"), root)
    assert outside.is_dir()


def test_sizes_in_words():
    assert [size_text(n) for n in (0, 999, 1000, 12_345_678, 1_300_000_000, 517_000_000)] == [
        "0 B", "999 B", "1.0 kB", "12 MB", "1.3 GB", "517 MB"]


def test_an_older_database_gains_the_pruned_mark_and_a_pruned_policy_is_refused_in_a_sentence(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    for migration in MIGRATIONS[:8]:
        migration(db)
    db.conn.execute("PRAGMA user_version = 8")
    db["policies"].insert_all([{"round": 0, "path": "base", "created_at": "t"},
                               {"round": 1, "path": "/ck/round-1/policy", "parent_id": 1, "created_at": "t"},
                               {"round": 2, "path": "/ck/round-2/policy", "parent_id": 2, "created_at": "t"}])
    db.conn.commit()
    db.conn.close()
    with Store(path) as store:
        assert store.schema_version() == len(MIGRATIONS)
        assert [p.pruned_at for p in store.policies()] == [None, None, None]
        store.mark_policy_pruned(2)
        first_time = store.policy(2).pruned_at
        store.mark_policy_pruned(2)  # again: the first time stays
        assert store.policy(2).pruned and store.policy(2).pruned_at == first_time
        with pytest.raises(KeyError):
            store.mark_policy_pruned(9)
        with pytest.raises(PolicyPruned, match=r"^policy 2 \(round 1\) was pruned at .* to bound the disk "
                                               r"\(round.keep_policies\): its folder /ck/round-1/policy is gone\."):
            loadable_path(store.policy(2))
        assert loadable_path(store.policy(3)) == "/ck/round-2/policy"
        from loop.policies import policy_model

        with pytest.raises(PolicyPruned, match="policy 2 .* was pruned"):
            policy_model(store, 2)
        assert earlier_policy(store, store.policy(3)).id == 1  # its parent is pruned: the latest kept earlier one


def test_a_report_made_again_refuses_a_pruned_policy(tmp_path):
    from loop.report import ReportRefused, make_round_report

    with Store() as store:
        base = store.add_policy(0, "default")
        new = store.add_policy(1, str(tmp_path / "round-1" / "policy"), parent_id=base)
        round_id = store.start_round()
        store.update_round_metrics(round_id, {"round/policy_id": new, "round/actor_policy_id": base})
        store.finish_round(round_id)
        store.mark_policy_pruned(new)
        with pytest.raises(ReportRefused, match=r"round 1's report cannot be made again: policy 2 \(round 1\) was "
                                                r"pruned"):
            make_round_report(store, round_id, load_config(None, []))


def fake_rounds(db: Path, root: Path, n_rounds: int) -> None:
    """A database whose rounds 1..n saved policy r + 1 and a reward model in <root>/round-r, each folder one file of
    r * 1000 bytes."""
    with Store(db) as store:
        store.add_policy(0, "default")
        for r in range(1, n_rounds + 1):
            for name in ("policy", "reward"):
                (root / f"round-{r}" / name).mkdir(parents=True)
                (root / f"round-{r}" / name / "model.safetensors").write_bytes(b"x" * (r * 1000))
            (root / f"round-{r}" / "report.html").write_text("<p>kept</p>")
            policy_id = store.add_policy(r, str(root / f"round-{r}" / "policy"), parent_id=r)
            round_id = store.start_round()
            store.update_round_metrics(round_id, {"round/policy_id": policy_id, "round/actor_policy_id": r,
                                                  "round/reward_model_path": str(root / f"round-{r}" / "reward")})
            store.finish_round(round_id)


def test_prune_dry_run_lists_and_deletes_nothing_then_prune_frees_and_marks(tmp_path, capsys):
    db, checkpoints = tmp_path / "loop.db", tmp_path / "checkpoints"
    root = checkpoints / "loop"
    fake_rounds(db, root, 4)
    before = folder_bytes(root)
    flags = ["--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}", "--set", "round.keep_policies=1"]
    assert app.main(["--prune", "--dry-run", *flags]) == 0
    listing = capsys.readouterr().out
    assert folder_bytes(root) == before
    assert "  would delete   1.0 kB  policy 2 (round-1/policy): neither current nor its parent" in listing
    assert "  kept           4.0 kB  policy 5 (round-4/policy): the current policy" in listing
    assert "  kept           3.0 kB  reward model of round 3 (round-3/reward): made with policy 4, which is kept" \
        in listing
    assert "Pruning would free 6.0 kB in 4 folder(s); 4 kept (14 kB, round.keep_policies = 1)." in listing
    assert f"Disk: checkpoints {size_text(before)} (4 policies, 4 reward models) in {root}" in listing
    assert app.main(["--prune", *flags]) == 0
    done = capsys.readouterr().out
    assert "  deleted        1.0 kB  policy 2 (round-1/policy): neither current nor its parent" in done
    assert "Pruning freed 6.0 kB in 4 folder(s)" in done and "(2 policies, 2 reward models)" in done
    assert sorted(p.name for p in root.iterdir()) == ["round-1", "round-2", "round-3", "round-4"]
    assert not (root / "round-2" / "policy").exists() and (root / "round-2" / "report.html").is_file()
    with Store(db) as store:
        assert [p.id for p in store.policies() if p.pruned] == [2, 3]
        assert all((Path(p.path) / "model.safetensors").is_file() for p in store.policies() if p.round and not p.pruned)
    assert app.main(["--prune", *flags]) == 0  # again: nothing left to delete
    assert "Pruning freed 0 B in 0 folder(s)" in capsys.readouterr().out


def test_the_best_by_peoples_votes_reads_them_weighted_as_promotion_does(tmp_path, capsys):
    db, checkpoints = tmp_path / "loop.db", tmp_path / "checkpoints"
    fake_rounds(db, checkpoints / "loop", 4)
    with Store(db) as store:  # policy 2 (round 1) against the base, policy 1, on 40 versus pairs
        store.add_prompts([f"Question {i}?" for i in range(40)], source="test")
        for name in ("careful", "left"):
            store.add_annotator(name)
        for prompt in range(1, 41):
            newer, older = (store.add_generation(prompt, policy, f"{policy}-{prompt}", 2, "eos") for policy in (2, 1))
            pair = store.add_pair(prompt, newer, older, kind="versus")
            if prompt <= 20:  # careful: policy 2 on 18 of 20
                store.record_vote(pair, "careful", "a" if prompt <= 18 else "b", a_on_left=prompt % 2 == 0)
            else:  # left: the left answer every time, policy 1's on 17 of 20
                store.record_vote(pair, "left", "b" if prompt <= 37 else "a", a_on_left=prompt > 37)
    flags = ["--prune", "--dry-run", "--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}",
             "--set", "round.keep_policies=1"]
    # majority: 21 of 40 (lower bound 37%) is no step forward; reliability: the always-left voter weighs 0 and the
    # careful one's 18 of 20 (lower bound 70%) make policy 2 the best
    assert app.main(flags) == 0
    assert "would delete   1.0 kB  policy 2 (round-1/policy): neither current nor its parent" in capsys.readouterr().out
    assert app.main([*flags, "--set", "votes.weighting=reliability"]) == 0
    assert ("kept           1.0 kB  policy 2 (round-1/policy): the best by people's votes: 90% against policy 1 over "
            "20 judged votes (95% lower bound 70%)") in capsys.readouterr().out


def test_prune_refuses_while_a_round_holds_the_lock(tmp_path, capsys):
    db, checkpoints = tmp_path / "loop.db", tmp_path / "checkpoints"
    fake_rounds(db, checkpoints / "loop", 3)
    before = folder_bytes(checkpoints)
    lock = RoundLock(db).acquire()
    try:
        for dry_run in ([], ["--dry-run"]):
            assert app.main(["--prune", *dry_run, "--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}",
                             "--set", "round.keep_policies=1"]) == 4
            assert "Nothing was deleted." in capsys.readouterr().err
    finally:
        lock.release()
    assert folder_bytes(checkpoints) == before


def test_the_disk_line_counts_what_is_on_disk(tmp_path):
    db, checkpoints = tmp_path / "loop.db", tmp_path / "checkpoints"
    root = checkpoints / "loop"
    fake_rounds(db, root, 2)
    with Store(db) as store:
        named = named_checkpoints(store.policies(), store.rounds(), root)
        line = disk_line(root, db, named)
        assert line.startswith(f"Disk: checkpoints {size_text(folder_bytes(root))} (2 policies, 2 reward models) in ")
        assert line.endswith(f"database {size_text(folder_bytes(tmp_path) - folder_bytes(checkpoints))}")
        assert disk_line(None, db, []).startswith("Disk: database ")


def test_four_rounds_keeping_one_policy_complete_and_keep_only_what_they_need(tmp_path, tiny_model_dir):
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["round.min_new_pairs=1", "round.keep_policies=1",
                                                          "round.report_prompts=2", "round.next_pairs=8"])
    said: list[str] = []
    for number in range(4):
        result = run_round(db, str(tiny_model_dir), config, log=said.append)
        with Store(db) as store:
            simulate_votes(store, resolve_judge("longer"), f"sim{number}", n_votes=store.pairs_waiting())
    root = tmp_path / "checkpoints" / "loop"
    with Store(db) as store:
        assert [r.status for r in store.rounds()] == ["done"] * 4
        policies = store.policies()
        kept = [p for p in policies if p.round > 0 and not p.pruned]
        assert [p.round for p in kept] == [3, 4]  # the current policy and its parent (the last round's actor)
        assert [p.round for p in policies if p.pruned] == [1, 2]
        on_disk = sorted(str(path.parent) for path in root.glob("round-*/policy/config.json"))
        assert on_disk == sorted(p.path for p in kept)  # the folder holds the kept policies, no more
        assert all((Path(p.path) / "config.json").is_file() for p in kept)
        last = store.last_done_round()
        assert Path(last.metrics["round/reward_model_path"]).is_dir()  # the next round's warm start
        assert result.policy_id == kept[-1].id
        from loop.pairs import make_pairs
        from rlhf.sampling import Sampling

        report = make_pairs(store, PairRequest(4, kept[-1].id, versus_share=1.0, sampling=Sampling(max_new_tokens=6),
                                               seed=1))
        assert report.versus_policy_id == kept[0].id  # versus pairs against the kept parent
    assert any("Pruning freed" in line for line in said)
    with Store(db) as store:  # a fifth round plans from what is kept
        assert prune_checkpoints(store, config, dry_run=True).deleted == []
