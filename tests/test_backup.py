"""--backup and --restore: a database and the checkpoint folders it names, copied while rounds run, put back in a
fresh folder (another machine's paths), where every vote is there, every folder named loads and the next round runs."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import app
from annotate.records import Policy, Round
from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from loop.backup import (COPIED, EMBEDDED, MISSING, MODEL_NAME, MANIFEST, backup_place, named_folders,
                         status_on_disk)
from loop.config_files import load_config
from loop.file_lock import AppLock
from loop.restore import BackupRefused, relink_moved_folders, restored_place
from loop.round import run_round
from loop.round_lock import RoundLock
from tests.test_round import seed_votes, tiny_settings

pytestmark = pytest.mark.usefixtures("one_thread")


def flags(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def vote_rows(db: Path) -> list:
    with Store(db) as store:
        return [(v.id, v.pair_id, v.annotator, v.choice) for v in store.votes()]


def model_folder(path: Path) -> Path:
    """A stand-in for a saved model: what the folder checks look for, and a hidden staging leftover."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 1000)
    (path / ".policy-staging").mkdir()
    return path


def small_store(tmp_path: Path) -> Path:
    """A database (no model needed) whose policies and round name: the default model by name, a policy and a reward
    model under the checkpoints folder, and an SFT folder outside it."""
    checkpoints = tmp_path / "checkpoints"
    db = tmp_path / "small.db"
    with Store(db) as store:
        store.add_prompts(["one?", "two?"])
        base = store.ensure_base_policy("default")
        sft = store.add_policy(0, str(model_folder(tmp_path / "sft-out")), parent_id=base.id)
        policy = model_folder(checkpoints / "small" / "round-1" / "policy")
        reward = model_folder(checkpoints / "small" / "round-1" / "reward")
        policy_id = store.add_policy(1, str(policy), parent_id=sft)
        round_id = store.start_round()
        store.finish_round(round_id, {"round/policy_path": str(policy), "round/reward_model_path": str(reward),
                                      "round/policy_id": policy_id, "round/reference": str(tmp_path / "sft-out")})
    return db


def test_named_folders_lists_each_name_once_with_what_names_it():
    policies = [Policy(1, 0, "default", None, "t"), Policy(2, 1, "ck/db/round-1/policy", 1, "t")]
    rounds = [Round(1, "done", "t", "t", {"round/policy_path": "ck/db/round-1/policy", "round/reference": "default",
                                          "round/reward_model_path": "ck/db/round-1/reward", "ppo/kl": 0.1}, None, 1)]
    named = {folder.original: folder.named_by for folder in named_folders(policies, rounds)}
    assert named == {"default": ["policy 1", "round 1 round/reference"],
                     "ck/db/round-1/policy": ["policy 2", "round 1 round/policy_path"],
                     "ck/db/round-1/reward": ["round 1 round/reward_model_path"]}


def test_a_folder_keeps_its_place_under_the_checkpoints_folder_and_others_go_elsewhere(tmp_path):
    checkpoints = tmp_path / "ck"
    inside = str(checkpoints / "db" / "round-2" / "reward")
    assert backup_place(inside, checkpoints, 4) == "checkpoints/db/round-2/reward"
    assert backup_place("/models/my-sft", checkpoints, 3) == "elsewhere/3-my-sft"
    assert restored_place("checkpoints/db/round-2/reward", "new") == Path("new/db/round-2/reward")
    assert restored_place("elsewhere/3-my-sft", "new") == Path("new/elsewhere/3-my-sft")
    for doctored in ("../etc", "/etc/passwd", "checkpoints/../../x", "other/x"):
        with pytest.raises(BackupRefused):
            restored_place(doctored, "new")


def test_a_name_is_copied_when_it_is_a_folder_and_kept_when_it_is_a_model_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_folder(tmp_path / "data" / "models" / "SmolLM2-135M-Instruct")
    model_folder(tmp_path / "mine")
    assert status_on_disk("default") == MODEL_NAME
    assert status_on_disk("HuggingFaceTB/SmolLM2-135M-Instruct") == MODEL_NAME
    assert status_on_disk("data/models/SmolLM2-135M-Instruct") == EMBEDDED
    assert status_on_disk(str(tmp_path / "mine")) == COPIED
    assert status_on_disk("data/checkpoints/db/round-9/policy") == MISSING


def test_rewrite_paths_moves_the_names_in_policies_and_round_metrics_at_once():
    store = Store()
    base = store.ensure_base_policy("/old/base")
    policy = store.add_policy(1, "/old/ck/policy", parent_id=base.id)
    round_id = store.start_round()
    store.finish_round(round_id, {"round/policy_path": "/old/ck/policy", "round/reference": "/old/base",
                                  "round/ppo_prompts": ["/old/base"], "ppo/kl": 0.5})
    # a new name that is also an old one is not moved twice
    assert store.rewrite_paths({"/old/base": "/old/ck/policy", "/old/ck/policy": "/new/policy"}) == 3
    assert [p.path for p in store.policies()] == ["/old/ck/policy", "/new/policy"]
    assert store.policy(policy).path == "/new/policy"
    assert store.round(round_id).metrics == {"round/policy_path": "/new/policy", "round/reference": "/old/ck/policy",
                                             "round/ppo_prompts": ["/old/base"], "ppo/kl": 0.5}
    assert store.rewrite_paths({}) == 0


def test_backup_writes_the_database_the_folders_and_a_manifest_and_restore_moves_every_name(tmp_path, capsys):
    db = small_store(tmp_path / "here")
    checkpoints = tmp_path / "here" / "checkpoints"
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}"]) == 0
    captured = capsys.readouterr()
    assert "Backed up" in captured.out and "3 checkpoint folders" in captured.out
    manifest = json.loads((backup / MANIFEST).read_text())
    assert manifest["format"] == 1 and manifest["schema_version"] == Store(db).schema_version()
    assert manifest["database"]["file"] == "small.db" and (backup / "small.db").is_file()
    assert not (backup / "small.db-wal").exists()
    by_original = {entry["original"]: entry for entry in manifest["folders"]}
    assert by_original["default"]["status"] == MODEL_NAME
    policy = by_original[str(checkpoints / "small" / "round-1" / "policy")]
    assert policy["backup"] == "checkpoints/small/round-1/policy" and policy["bytes"] == 1002
    assert by_original[str(tmp_path / "here" / "sft-out")]["backup"].startswith("elsewhere/")
    assert not (backup / "checkpoints" / "small" / "round-1" / "policy" / ".policy-staging").exists()

    shutil.rmtree(tmp_path / "here")  # another machine: nothing of the original is left
    target, new_checkpoints = tmp_path / "there" / "restored.db", tmp_path / "there" / "ck"
    Path(f"{target}-wal").parent.mkdir(parents=True)
    Path(f"{target}-wal").write_bytes(b"stale")  # left by a database that is gone
    assert app.main(["--restore", str(backup), "--db", str(target),
                     "--set", f"round.checkpoints_dir={new_checkpoints}"]) == 0
    assert "integrity check ok" in capsys.readouterr().out
    assert not Path(f"{target}-wal").exists() or Path(f"{target}-wal").read_bytes() != b"stale"
    assert integrity(target) == "ok"
    with Store(target) as store:
        paths = [p.path for p in store.policies()]
        metrics = store.rounds()[0].metrics
    assert paths[0] == "default"
    assert all((Path(path) / "config.json").is_file() and Path(path).is_relative_to(new_checkpoints)
               for path in paths[1:])
    assert metrics["round/reference"] == paths[1] and metrics["round/policy_path"] == paths[2]
    assert Path(metrics["round/reward_model_path"]) == new_checkpoints / "small" / "round-1" / "reward"


def test_backup_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    db = small_store(tmp_path)
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "something").write_text("x")
    assert app.main(["--backup", str(backup), "--db", str(db)]) == 2
    assert "is a folder that is not empty" in capsys.readouterr().err
    assert sorted(os.listdir(backup)) == ["something"]


def test_restore_refuses_while_the_app_or_a_round_holds_its_lock_and_writes_nothing(tmp_path, capsys):
    db = small_store(tmp_path / "here")
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", str(db)]) == 0
    target = tmp_path / "there" / "restored.db"
    for lock, said in ((AppLock(target), "the annotation app serves"), (RoundLock(target), "a round is running")):
        with lock:
            assert app.main(["--restore", str(backup), "--db", str(target),
                             "--set", f"round.checkpoints_dir={tmp_path / 'there' / 'ck'}"]) == 4
        assert said in capsys.readouterr().err
        assert not target.exists() and not (tmp_path / "there" / "ck").exists()


def test_restore_replaces_no_database_and_no_checkpoint_folder(tmp_path, capsys):
    db = small_store(tmp_path / "here")
    checkpoints = tmp_path / "here" / "checkpoints"
    backup = tmp_path / "backup"
    settings = ["--set", f"round.checkpoints_dir={checkpoints}"]
    assert app.main(["--backup", str(backup), "--db", str(db), *settings]) == 0
    assert app.main(["--restore", str(backup), "--db", str(db), *settings]) == 2
    assert "exists already, and a restore never replaces a database" in capsys.readouterr().err
    assert app.main(["--restore", str(backup), "--db", str(tmp_path / "other.db"), *settings]) == 2
    assert "checkpoint folders exist already" in capsys.readouterr().err
    assert not (tmp_path / "other.db").exists()
    assert app.main(["--restore", str(tmp_path), "--db", str(tmp_path / "other.db")]) == 2
    assert "holds no readable manifest.json" in capsys.readouterr().err


def test_a_named_folder_that_is_gone_is_said_in_the_backup_and_noted_by_the_restore(tmp_path, capsys):
    db = small_store(tmp_path / "here")
    checkpoints = tmp_path / "here" / "checkpoints"
    shutil.rmtree(checkpoints / "small" / "round-1" / "reward")  # pruned, or removed by hand
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}"]) == 0
    captured = capsys.readouterr()
    assert "not copied: " + str(checkpoints / "small" / "round-1" / "reward") in captured.err
    assert "1 named folder not in it" in captured.out
    target = tmp_path / "there" / "restored.db"
    assert app.main(["--restore", str(backup), "--db", str(target),
                     "--set", f"round.checkpoints_dir={tmp_path / 'there' / 'ck'}"]) == 0
    assert "note: " + str(checkpoints / "small" / "round-1" / "reward") in capsys.readouterr().err


def test_a_folder_removed_while_it_is_copied_is_said_and_the_backup_goes_on(tmp_path, monkeypatch, capsys):
    db = small_store(tmp_path / "here")
    checkpoints = tmp_path / "here" / "checkpoints"
    reward = checkpoints / "small" / "round-1" / "reward"
    copytree = shutil.copytree

    def pruned_meanwhile(source, target, **kwargs):
        if Path(source) == reward:
            shutil.rmtree(reward)
            raise FileNotFoundError(2, "No such file or directory", str(reward / "config.json"))
        return copytree(source, target, **kwargs)

    monkeypatch.setattr(shutil, "copytree", pruned_meanwhile)
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", str(db), "--set", f"round.checkpoints_dir={checkpoints}"]) == 0
    assert "removed while the backup copied it" in capsys.readouterr().err
    (entry,) = [e for e in json.loads((backup / MANIFEST).read_text())["folders"] if e["original"] == str(reward)]
    assert (entry["status"], entry["backup"]) == (MISSING, None)
    assert not [name for name in os.listdir(backup) if name.startswith(".")]  # no staging folder left


def test_a_restored_database_naming_a_folder_not_there_exits_2_with_the_list(tmp_path, monkeypatch, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    embedded = model_folder(here / "data" / "models" / "SmolLM2-135M-Instruct")
    monkeypatch.chdir(here)
    with Store(here / "small.db") as store:
        store.ensure_base_policy("data/models/SmolLM2-135M-Instruct")  # the embedded model, named by its folder
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", "small.db"]) == 0
    assert not (backup / "elsewhere").exists() and embedded.is_dir()
    there.mkdir()
    monkeypatch.chdir(there)  # another machine, where the default model was never converted
    assert app.main(["--restore", str(backup), "--db", "small.db"]) == 2
    err = capsys.readouterr().err
    assert "the restored database is not whole" in err and "data/models/SmolLM2-135M-Instruct (policy 1)" in err
    assert "the embedded model" in err and integrity(there / "small.db") == "ok"


def test_rounds_backed_up_restore_in_a_fresh_folder_with_every_vote_and_the_next_round_runs(tmp_path,
                                                                                           tiny_model_dir, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    db = here / "loop.db"
    seed_votes(db, tiny_model_dir)
    run_round(db, str(tiny_model_dir), load_config(None, tiny_settings(here)), log=lambda message: None)
    backup = tmp_path / "backup"
    assert app.main(["--backup", str(backup), "--db", str(db), *flags(tiny_settings(here))]) == 0
    votes = vote_rows(db)
    shutil.rmtree(here / "checkpoints")  # the restore needs nothing but the backup (and the model it was named by)

    target = there / "restored.db"
    assert app.main(["--restore", str(backup), "--db", str(target), *flags(tiny_settings(there))]) == 0
    assert integrity(target) == "ok"
    assert vote_rows(target) == votes
    store = Store(target)
    for policy in store.policies():  # the base (a folder: the tiny model) was copied too
        assert (Path(policy.path) / "config.json").is_file() and Path(policy.path).is_relative_to(there)
    from rlhf.models import load_causal_lm
    load_causal_lm(store.latest_policy().path)
    assert Path(store.rounds()[0].metrics["round/reward_model_path"]).is_dir()

    simulate_votes(store, resolve_judge("longer"), "sim2", n_votes=6)
    store.add_prompts([f"Another question, number {i}?" for i in range(8)], source="test")
    config = load_config(None, tiny_settings(there) + ["round.min_new_pairs=2"])
    second = run_round(target, str(tiny_model_dir), config, log=lambda message: None)
    assert [r.status for r in store.rounds()] == ["done", "done"]
    assert Path(store.policy(second.policy_id).path).is_relative_to(there)
    assert [p.round for p in store.policies()] == [0, 1, 2]


def test_a_backup_taken_while_a_round_runs_restores_and_the_next_round_goes_on(tmp_path, tiny_model_dir, capsys):
    here, there = tmp_path / "here", tmp_path / "there"
    db = here / "crash.db"
    seed_votes(db, tiny_model_dir)
    command = [sys.executable, "app.py", "--train-round", "--db", str(db), "--model", str(tiny_model_dir)]
    process = subprocess.Popen([*command, *flags(tiny_settings(here, ppo_steps=400))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    backup = tmp_path / "backup"
    try:
        store, deadline = Store(db), time.time() + 240
        while time.time() < deadline:  # back up in the middle of PPO, after the reward model is saved
            running = store.running_round()
            if running and running.metrics.get("history"):
                break
            assert process.poll() is None, "the round ended before the backup"
            time.sleep(0.2)
        else:
            pytest.fail("the round never reached PPO")
        assert app.main(["--backup", str(backup), "--db", str(db), *flags(tiny_settings(here))]) == 0
        assert process.poll() is None, "the round ended during the backup"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    votes = vote_rows(db)

    target = there / "crash.db"
    assert app.main(["--restore", str(backup), "--db", str(target), *flags(tiny_settings(there))]) == 0
    assert "was running when the backup was taken: marked failed" in capsys.readouterr().err
    assert integrity(target) == "ok"
    assert vote_rows(target) == votes
    assert app.main(["--train-round", "--db", str(target), "--model", str(tiny_model_dir),
                     *flags(tiny_settings(there, ppo_steps=1))]) == 0
    with Store(target) as restored:
        rounds = restored.rounds()
        assert [r.status for r in rounds] == ["failed", "done"]
        reward = rounds[1].metrics["round/reward_model_path"]
        assert reward == rounds[0].metrics["round/reward_model_path"]  # the backed-up reward model, reused
        assert Path(reward).is_relative_to(there)
        assert [p.round for p in restored.policies()] == [0, 1]


def test_a_restored_folder_names_the_restored_places_of_the_folders_it_sits_on(tmp_path):
    adapter, reward = tmp_path / "policy", tmp_path / "reward"
    adapter.mkdir(), reward.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/old/round-1/policy", "r": 8}))
    (reward / "preference_strategy.json").write_text(json.dumps({"base_model": "default", "strategy": "lpft"}))
    relink_moved_folders([adapter, reward], {"/old/round-1/policy": "/new/round-1/policy"})
    assert json.loads((adapter / "adapter_config.json").read_text()) == {
        "base_model_name_or_path": "/new/round-1/policy", "r": 8}
    assert json.loads((reward / "preference_strategy.json").read_text())["base_model"] == "default"  # not moved
