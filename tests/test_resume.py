"""A round killed at each stage boundary goes on from the crashed round's own plan, and nothing that is not a finite
number is published (issue #32, items 2 and 3), on the tiny model."""

import math

import pytest
import torch

import app
import loop.round as round_module
from annotate.store import Store
from loop.config_files import load_config
from loop.round import run_round
from rlhf.finite import NotFinite, non_finite_metric, non_finite_tensor, refuse_non_finite
from tests.test_round import seed_votes, tiny_settings


class Killed(BaseException):
    """What a kill -9 would do to the round at this point: it stops, and its row stays `running`."""


def _quiet(message: str) -> None:
    pass


def _round_killed_before(stage: str, monkeypatch, db, model_dir, config) -> None:
    """Run a round that dies as it enters `stage` ("reward", "ppo", "pairs", "report") and leaves its row `running`,
    as kill -9 would (fail_round never runs; the lock is freed as the OS frees a dead process's lock)."""
    def killed(*args, **kwargs):
        raise Killed(f"killed entering the {stage} stage")

    with monkeypatch.context() as patch:
        patch.setattr(round_module, f"_{stage}_stage", killed)
        patch.setattr(Store, "fail_round", lambda self, round_id, error: None)
        with pytest.raises(Killed):
            run_round(db, str(model_dir), config, log=_quiet)
    assert Store(db).running_round() is not None  # what a kill -9 leaves: our own pid, alive, on a `running` row


def _versus_policies(store: Store, after_pair: int) -> list[set[int]]:
    """The policies of each versus pair queued after pair `after_pair`."""
    pairs = [store.pair(pair_id) for pair_id in range(after_pair + 1, store.count_pairs() + 1)]
    return [{store.generation(p.gen_a).policy_id, store.generation(p.gen_b).policy_id}
            for p in pairs if p.kind == "versus"]


@pytest.fixture
def crash_db(tmp_path, tiny_model_dir):
    db = tmp_path / "crash.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["round.versus_share=0.5", "round.report_prompts=0"],
                         default_file=None)
    return db, config


def test_killed_entering_the_pairs_stage_resumes_with_the_crashed_rounds_actor_and_figures(crash_db, tiny_model_dir,
                                                                                             monkeypatch):
    db, config = crash_db
    store = Store(db)
    pairs_before = store.count_pairs()
    _round_killed_before("pairs", monkeypatch, db, tiny_model_dir, config)
    crashed = store.rounds()[0]
    assert crashed.metrics["round/policy_id"] == 2 and crashed.metrics["round/actor_policy_id"] == 1

    result = run_round(db, str(tiny_model_dir), config, log=_quiet)
    first, resumed = store.rounds()
    assert (first.status, resumed.status) == ("failed", "done")
    assert [p.id for p in store.policies()] == [1, 2]  # no PPO again: the crashed round's policy is the round's
    assert result.policy_id == 2
    versus = _versus_policies(store, pairs_before)
    assert versus and all(policies == {1, 2} for policies in versus)  # the new policy against the one before it
    for key in ("round/reward_model_path", "rm/heldout_accuracy", "ppo/kl", "history", "round/rm_strategy"):
        assert resumed.metrics[key] == crashed.metrics[key], key
    assert resumed.metrics["round/resumed_from"] == first.id
    assert resumed.metrics["round/actor_policy_id"] == 1
    assert result.metrics["rm/heldout_accuracy"] == crashed.metrics["rm/heldout_accuracy"]  # the printed summary


def test_killed_entering_ppo_reuses_the_reward_model_and_keeps_its_accuracy(crash_db, tiny_model_dir, monkeypatch):
    db, config = crash_db
    store = Store(db)
    _round_killed_before("ppo", monkeypatch, db, tiny_model_dir, config)
    crashed = store.rounds()[0]

    run_round(db, str(tiny_model_dir), config, log=_quiet)
    resumed = store.rounds()[1]
    assert resumed.status == "done"
    assert resumed.metrics["round/reward_model_path"] == crashed.metrics["round/reward_model_path"]
    for key in ("rm/heldout_accuracy", "rm/heldout_low", "rm/n_train", "round/rm_strategy"):
        assert resumed.metrics[key] == crashed.metrics[key], key
    assert resumed.metrics["round/ppo_prompts"] == crashed.metrics["round/ppo_prompts"]
    assert resumed.metrics["round/policy_id"] == 2 and [p.round for p in store.policies()] == [0, 1]


def test_killed_entering_the_report_finishes_without_queuing_the_pairs_twice(crash_db, tiny_model_dir, monkeypatch):
    db, config = crash_db
    config.round.report_prompts = 2
    store = Store(db)
    _round_killed_before("report", monkeypatch, db, tiny_model_dir, config)
    pairs_after_crash = store.count_pairs()
    crashed = store.rounds()[0]
    assert crashed.metrics["round/pairs_generated"] > 0

    run_round(db, str(tiny_model_dir), config, log=_quiet)
    resumed = store.rounds()[1]
    assert resumed.status == "done"
    assert store.count_pairs() == pairs_after_crash  # the crashed round's pairs are the round's
    assert [p.id for p in store.policies()] == [1, 2]
    assert resumed.metrics["round/pairs_generated"] == crashed.metrics["round/pairs_generated"]
    assert store.round_report(resumed.id) is not None


def test_killed_entering_the_reward_stage_trains_afresh(crash_db, tiny_model_dir, monkeypatch):
    db, config = crash_db
    store = Store(db)
    _round_killed_before("reward", monkeypatch, db, tiny_model_dir, config)
    run_round(db, str(tiny_model_dir), config, log=_quiet)
    crashed, resumed = store.rounds()
    assert crashed.status == "failed" and resumed.status == "done"
    assert "round/resumed_from" not in resumed.metrics  # nothing to go on from
    assert resumed.metrics["round/reward_model_path"].endswith(f"round-{resumed.id}/reward")


def test_a_round_whose_ppo_goes_nan_is_failed_at_that_step_and_publishes_nothing(crash_db, tiny_model_dir):
    db, config = crash_db
    store = Store(db)
    pairs_before = store.count_pairs()

    def nan_reward(answers):
        return [math.nan] * len(answers)

    with pytest.raises(NotFinite, match="PPO step 1 of 1"):
        run_round(db, str(tiny_model_dir), config, log=_quiet, reward_function=nan_reward)
    failed = store.rounds()[0]
    assert failed.status == "failed" and "PPO step 1 of 1" in failed.error
    assert [p.round for p in store.policies()] == [0]  # the previous policy stays current
    assert store.count_pairs() == pairs_before  # no pairs of a NaN policy for people to vote on
    assert (db.parent / "checkpoints").is_dir() and not list((db.parent / "checkpoints").rglob("*policy*"))

    done = run_round(db, str(tiny_model_dir), config, log=_quiet)  # the next round goes on from the reward model
    assert store.round(done.round_id).status == "done"
    assert store.policy(done.policy_id).parent_id == 1


def test_a_reward_model_with_a_nan_weight_is_not_saved_and_the_round_exits_5(crash_db, tmp_path, tiny_model_dir,
                                                                             monkeypatch, capsys):
    import rlhf.reward.strategies as strategies

    db, _config = crash_db
    fit = strategies.fit_feature_heads

    def nan_head(*args, **kwargs):
        weight, heads, metrics = fit(*args, **kwargs)
        weight[0] = math.nan
        return weight, heads, metrics

    monkeypatch.setattr(strategies, "fit_feature_heads", nan_head)
    settings = [arg for setting in tiny_settings(tmp_path) for arg in ("--set", setting)]
    assert app.main(["--train-round", "--db", str(db), "--model", str(tiny_model_dir), *settings]) == 5
    assert "round failed: the head reward model: the weight head holds NaN" in capsys.readouterr().err
    store = Store(db)
    assert store.rounds()[0].status == "failed"
    assert "round/reward_model_path" not in store.rounds()[0].metrics
    assert not list((db.parent / "checkpoints").rglob("reward_model.json"))
    assert [p.round for p in store.policies()] == [0]


def test_non_finite_metrics_and_tensors_are_named_worked_by_hand():
    assert non_finite_metric({"ppo/kl": 0.5, "ppo/score": math.nan, "ppo/reward": math.inf}) == "ppo/score = nan"
    assert non_finite_metric({"ppo/kl": -math.inf}) == "ppo/kl = -inf"
    assert non_finite_metric({"ok": True, "name": "x", "none": None, "n": 3, "x": 1e308}) is None
    tensors = [("a", torch.ones(3)), ("ids", torch.tensor([1, 2])), ("b", torch.tensor([1.0, math.inf]))]
    assert non_finite_tensor(tensors) == "b"
    assert non_finite_tensor(tensors[:2]) is None
    refuse_non_finite("nothing wrong", {"x": 1.0}, tensors[:2])  # returns quietly
    with pytest.raises(NotFinite, match=r"^PPO step 3 of 8: ppo/kl = inf, which is not a finite number"):
        refuse_non_finite("PPO step 3 of 8", {"ppo/kl": math.inf})
