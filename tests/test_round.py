"""The round end to end on the tiny model: two rounds, a killed round resumed, refusals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import app
from loop.pair_request import PairRequest
from loop.pairs import make_pairs
from annotate.simulate import resolve_judge, simulate_votes
from annotate.store import Store
from loop.config_files import load_config
from rlhf.sampling import Sampling
from loop.round_lock import RoundLock
from loop.round import run_round

PROMPTS = [f"Tell me something about the number {i}." for i in range(24)]


def tiny_settings(tmp_path: Path, ppo_steps: int = 1) -> list[str]:
    """Overrides that make a round of the tiny model take seconds."""
    return [
        "round.min_new_pairs=4", "round.min_accuracy=0.0", "round.ppo_prompts=8", "round.next_pairs=6",
        f"round.checkpoints_dir={tmp_path / 'checkpoints'}",
        "reward.batch_size=4", "reward.max_length=96", "reward.heldout_fraction=0.25", "reward.min_pairs=4",
        f"ppo.steps={ppo_steps}", "ppo.batch_size=4", "ppo.mini_batch_size=4",
        "ppo.sampling.max_new_tokens=8", "sampling.max_new_tokens=12", "pairs.batch_size=8",
        "promotion.rule=always",  # these tests follow a chain of rounds; tests/test_promotion.py tests the evidence
    ]


def seed_votes(db: Path, model_dir: Path, n_pairs: int = 12) -> None:
    store = Store(db)
    store.add_prompts(PROMPTS, source="test")
    policy = store.ensure_base_policy(str(model_dir))
    make_pairs(store, PairRequest(n_pairs, policy.id, sampling=Sampling(max_new_tokens=12), seed=0))
    simulate_votes(store, resolve_judge("longer"), "sim", n_votes=n_pairs)
    store.close()


def test_two_rounds_record_two_policies_their_metrics_and_fresh_pairs(tmp_path, tiny_model_dir, monkeypatch):
    import rlhf.reward.annotator_agreement

    monkeypatch.setattr(rlhf.reward.annotator_agreement, "MIN_OTHER_VOTES", 1)  # two voters of a few votes each
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    # the tiny model's 12-token answers often have equal word counts, which `longer` ties: of the 6 pairs the first
    # round queues (its seeded draws) 3 get a/b votes, so the second round is allowed to start from 2
    config = load_config(None, tiny_settings(tmp_path) + ["round.min_new_pairs=2"])
    first = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    store = Store(db)
    simulate_votes(store, resolve_judge("longer"), "sim2", n_votes=6)
    store.add_prompts([f"Another question, number {i}?" for i in range(8)], source="test")
    second = run_round(db, str(tiny_model_dir), config, log=lambda message: None)

    policies = store.policies()
    assert [p.round for p in policies] == [0, 1, 2]
    assert [p.id for p in policies[1:]] == [first.policy_id, second.policy_id]
    assert policies[2].parent_id == policies[1].id
    assert all((Path(p.path) / "config.json").is_file() for p in policies[1:])
    rounds = store.rounds()
    assert [r.status for r in rounds] == ["done", "done"]
    for round_ in rounds:
        for key in ("rm/heldout_accuracy", "ppo/kl", "ppo/reward", "round/pairs_generated", "history"):
            assert key in round_.metrics
    assert rounds[1].metrics["round/reward_model_path"] != rounds[0].metrics["round/reward_model_path"]
    assert rounds[0].metrics["round/rm_strategy"] == "head"
    assert rounds[0].metrics["round/normalize_rewards"] is True  # round.adapt_ppo_to_head, on by default
    assert rounds[0].metrics["round/ppo_lam"] == 1.0
    assert [r.metrics["round/ppo_seed"] for r in rounds] == [1, 2]  # round.seed 0 + the round's id, not [ppo].seed
    for round_ in rounds:  # held-out accuracy by source, each with its count (every pair here is a random one)
        assert round_.metrics["rm/n_heldout"] == round_.metrics["rm/n_heldout_sample"] + \
            round_.metrics["rm/n_heldout_versus"] + round_.metrics["rm/n_heldout_chosen"]
        assert {"rm/heldout_accuracy_versus", "rm/heldout_accuracy_chosen"} <= set(round_.metrics)
    # round 1: one voter, nobody else to fit on; round 2: each voter against a head fitted on the other's votes
    assert rounds[0].metrics["people/model_agreement"] == {}
    measured = rounds[1].metrics["people/model_agreement"]
    ab = {name: sum(v.choice in ("a", "b") for v in store.votes(annotator=name)) for name in ("sim", "sim2")}
    assert {name: judged for name, (_, judged) in measured.items()} == ab
    assert all(0 <= agreeing <= judged for agreeing, judged in measured.values())
    new_pairs = [store.pair(pid) for pid in range(1, store.count_pairs() + 1)]
    made_by = {store.generation(pair.gen_a).policy_id for pair in new_pairs}
    assert {first.policy_id, second.policy_id} <= made_by  # each round queued pairs from its new policy
    assert any(pair.kind == "versus" for pair in new_pairs)


def test_a_round_on_an_lpft_reward_model_trains_ppo_and_queues_the_next_pairs(tmp_path, tiny_model_dir):
    from rlhf.reward.strategies import saved_strategy

    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["votes.lpft_from_votes=1", "votes.finetune_epochs=2"])
    result = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    round_ = Store(db).round(result.round_id)
    assert round_.status == "done" and round_.metrics["round/rm_strategy"] == "lpft"  # auto, from 1 vote here
    assert saved_strategy(round_.metrics["round/reward_model_path"]) == "lpft"
    assert round_.metrics["round/normalize_rewards"] is True  # PPO adapts to it as to a head
    assert round_.metrics["rm/live_finetune_epoch"] == 2  # each epoch reported while it trains
    assert result.metrics["round/pairs_generated"] >= 1  # the next pairs chosen with it


@pytest.mark.parametrize("strategy, knob, adapted", [
    ("head", True, True), ("ensemble", True, True), ("lpft", True, True), ("full", True, False), (None, True, False),
    ("head", False, False),
])
def test_ppo_on_a_head_reward_model_normalises_scores_and_takes_lambda_one_unless_turned_off(tmp_path, strategy,
                                                                                            knob, adapted):
    import json

    from rlhf.reward.strategies import STRATEGY_FILE
    from loop.config import ppo_settings

    if strategy is not None:  # None: a folder from --train-reward, without the strategy file
        (tmp_path / STRATEGY_FILE).write_text(json.dumps({"strategy": strategy}))
    config = load_config(None, [f"round.adapt_ppo_to_head={str(knob).lower()}", "ppo.lam=0.9"])
    settings = ppo_settings(config, str(tmp_path))
    assert (settings.normalize_rewards, settings.lam) == ((True, 1.0) if adapted else (False, 0.9))
    assert settings.kl_ctl == config.ppo.kl_ctl and settings.actor_lr == config.ppo.actor_lr  # nothing else changes
    assert (config.ppo.normalize_rewards, config.ppo.lam) == (False, 0.9)  # the loaded configuration is left as it was


def test_ppo_seed_follows_round_seed_and_the_round_while_train_ppo_keeps_its_own(tmp_path):
    from loop.config import ppo_settings

    config = load_config(None, ["round.seed=7", "ppo.seed=42"])
    assert [ppo_settings(config, str(tmp_path), round_id).seed for round_id in (1, 2, 3)] == [8, 9, 10]
    assert ppo_settings(config, str(tmp_path)).seed == 42  # --train-ppo: no round, [ppo].seed
    assert config.ppo.seed == 42  # the loaded configuration is left as it was


def test_a_reward_function_takes_the_rounds_settings_with_its_scores_normalised(tmp_path):
    from loop.config import function_ppo_settings, ppo_settings

    config = load_config(None, ["round.adapt_ppo_to_head=false", "ppo.lam=0.9", "ppo.kl_ctl=0.07"])
    settings = ppo_settings(config, str(tmp_path), round_id=2)
    assert settings.normalize_rewards is False
    oracle = function_ppo_settings(settings)
    assert oracle.normalize_rewards is True
    assert (oracle.lam, oracle.kl_ctl, oracle.seed, oracle.steps) == (0.9, 0.07, 2, settings.steps)


def test_a_round_rewarded_by_a_function_and_its_ceiling_beside_it(tmp_path, tiny_model_dir):
    """reward_function replaces the reward model in PPO (which is still trained and measured); ceiling_reward runs PPO
    again from the same policy into a folder that is no policy of the loop."""
    db = tmp_path / "oracle.db"
    seed_votes(db, tiny_model_dir)
    seen = []

    def plus_one(texts):
        seen.extend(texts)
        return [1.0] * len(texts)

    config = load_config(None, tiny_settings(tmp_path))
    result = run_round(db, str(tiny_model_dir), config, log=lambda message: None, reward_function=plus_one,
                       ceiling_reward=lambda texts: [2.0] * len(texts))
    metrics = result.metrics
    assert metrics["ppo/score"] == 1.0 and metrics["ceiling/score"] == 2.0  # each run took its own function's scores
    assert "rm/heldout_accuracy" in metrics and metrics["round/ppo_reward"] == "function"
    assert metrics["round/normalize_rewards"] is True
    assert len(seen) == 4 and all(isinstance(text, str) and "<|im_end|>" not in text for text in seen)
    ceiling = Path(metrics["round/ceiling_policy_path"])
    assert ceiling == tmp_path / "checkpoints" / "oracle" / "round-1" / "ceiling-policy"
    assert (ceiling / "config.json").is_file() and "reward function" in (ceiling / "README.md").read_text()
    store = Store(db)
    assert [p.round for p in store.policies()] == [0, 1]
    assert store.latest_policy().id == result.policy_id and store.latest_policy().path != str(ceiling)
    assert store.round(result.round_id).status == "done" and metrics["round/pairs_generated"] > 0


def test_the_round_plan_carries_each_preferences_source_and_strength(tiny_model_dir):
    from annotate.records import NewGeneration, NewPair
    from loop.round_plan import plan_round

    store = Store(":memory:")
    store.add_prompts(["q1", "q2", "q3", "q4"], source="test")
    base = store.ensure_base_policy(str(tiny_model_dir))
    newer = store.add_policy(1, str(tiny_model_dir), parent_id=base.id)

    def new_pair(prompt_id, kind="sample", chosen_by=None):
        b_policy = newer if kind == "sample" else base.id  # versus: b is the earlier policy's answer
        return NewPair(prompt_id, NewGeneration(newer, f"a{prompt_id}", 1, "eos"),
                       NewGeneration(b_policy, f"b{prompt_id}", 1, "eos"), kind=kind, chosen_by=chosen_by)

    store.add_pairs_bulk([new_pair(1, chosen_by="random"), new_pair(2, chosen_by="uncertain"), new_pair(3),
                          new_pair(4, kind="versus")])
    for pair_id in (1, 2, 3, 4):
        store.record_vote(pair_id, "ann", "a", True, strength=2 if pair_id == 3 else 1)  # q3: "A is much better"
    config = load_config(None, ["round.min_new_pairs=1", "round.checkpoints_dir=unused"])
    plan = plan_round(store, str(tiny_model_dir), config, log=lambda message: None)
    assert [(p.prompt, p.chosen, p.rejected, p.source, p.strength) for p in plan.preferences] == [
        ("q1", "a1", "b1", "sample", 1.0), ("q2", "a2", "b2", "chosen", 1.0), ("q3", "a3", "b3", "sample", 2.0),
        ("q4", "a4", "b4", "versus", 1.0)]


def test_two_databases_sharing_a_checkpoints_dir_keep_their_own_round_folders(tmp_path, tiny_model_dir):
    """Round ids restart in each database; a demo database's round 1 must not replace the real one's policy."""
    config = load_config(None, tiny_settings(tmp_path))
    results = {}
    for name in ("real", "demo"):
        db = tmp_path / f"{name}.db"
        seed_votes(db, tiny_model_dir)
        results[name] = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    paths = {name: Path(Store(tmp_path / f"{name}.db").policy(result.policy_id).path)
             for name, result in results.items()}
    assert paths["real"] == tmp_path / "checkpoints" / "real" / "round-1" / "policy"
    assert paths["demo"] == tmp_path / "checkpoints" / "demo" / "round-1" / "policy"
    assert all((path / "config.json").is_file() for path in paths.values())  # the second round removed nothing


def test_too_few_new_pairs_is_refused_with_the_numbers(tmp_path, tiny_model_dir, capsys):
    db = tmp_path / "few.db"
    seed_votes(db, tiny_model_dir, n_pairs=2)
    settings = [arg for setting in tiny_settings(tmp_path) for arg in ("--set", setting)]
    code = app.main(["--train-round", "--db", str(db), "--model", str(tiny_model_dir), *settings])
    assert code == 3
    err = capsys.readouterr().err
    assert "new preference pairs since the last round (minimum 4" in err
    assert Store(db).rounds() == []


def test_a_second_concurrent_round_is_refused(tmp_path, tiny_model_dir, capsys):
    db = tmp_path / "busy.db"
    seed_votes(db, tiny_model_dir)
    with RoundLock(db):
        code = app.main(["--train-round", "--db", str(db), "--model", str(tiny_model_dir)])
    assert code == 4
    assert "Another round is running" in capsys.readouterr().err


def test_a_killed_round_leaves_the_database_consistent_and_the_next_one_completes(tmp_path, tiny_model_dir):
    db = tmp_path / "crash.db"
    seed_votes(db, tiny_model_dir)
    votes_before = len(Store(db).votes())
    settings = [arg for setting in tiny_settings(tmp_path, ppo_steps=400) for arg in ("--set", setting)]
    command = [sys.executable, "app.py", "--train-round", "--db", str(db), "--model", str(tiny_model_dir)]
    process = subprocess.Popen([*command, *settings], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = Store(db)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:  # kill it in the middle of PPO, after the reward model is saved
            running = store.running_round()
            if running and running.metrics.get("history"):
                break
            assert process.poll() is None, "the round ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the round never reached PPO")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    assert store.running_round() is not None  # what a crash leaves behind
    settings = [arg for setting in tiny_settings(tmp_path, ppo_steps=1) for arg in ("--set", setting)]
    assert app.main(["--train-round", "--db", str(db), "--model", str(tiny_model_dir), *settings]) == 0
    rounds = store.rounds()
    assert [r.status for r in rounds] == ["failed", "done"]
    assert rounds[1].metrics["round/reward_model_path"] == rounds[0].metrics["round/reward_model_path"]
    assert len(store.votes()) == votes_before
    assert [p.round for p in store.policies()] == [0, 1]


@pytest.mark.slow
def test_one_small_round_of_the_default_model_completes(tmp_path):
    db = tmp_path / "default.db"
    store = Store(db)
    store.add_prompts(PROMPTS[:8], source="test")
    policy = store.ensure_base_policy("default")
    make_pairs(store, PairRequest(8, policy.id, sampling=Sampling(max_new_tokens=16), seed=0))
    simulate_votes(store, resolve_judge("concise"), "sim", n_votes=8)
    overrides = tiny_settings(tmp_path) + ["sampling.max_new_tokens=16", "round.next_pairs=2", "round.versus_share=0.0"]
    result = run_round(db, "default", load_config(None, overrides), log=lambda message: None)
    assert store.round(result.round_id).status == "done"
    assert store.policy(result.policy_id).round == 1
    assert result.metrics["round/pairs_generated"] >= 1


def test_demo_loop_votes_runs_rounds_and_prints_one_json_line(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import json

    import loop.policies
    import annotate.simulate

    vote_seeds = []
    simulate = annotate.simulate.simulate_votes

    vote_scores = []

    def recording_simulate_votes(*args, seed=0, **kwargs):
        vote_seeds.append(seed)
        vote_scores.append(kwargs.get("score"))
        return simulate(*args, seed=seed, **kwargs)

    monkeypatch.setattr(annotate.simulate, "simulate_votes", recording_simulate_votes)
    judged_prompts = []
    answers_of = loop.policies.policy_answers

    def recording_policy_answers(policy_path, prompts, sampling, per_prompt, *args):
        judged_prompts.append((policy_path, list(prompts)))
        return answers_of(policy_path, prompts, sampling, per_prompt, *args)

    monkeypatch.setattr(loop.policies, "policy_answers", recording_policy_answers)
    db = tmp_path / "demo.db"
    settings = [arg for setting in tiny_settings(tmp_path) for arg in ("--set", setting)]
    code = app.main(["--demo-loop", "--rounds", "2", "--annotator", "longer", "--votes", "8", "--eval-prompts", "4",
                     "--eval-answers", "2", "--db", str(db), "--model", str(tiny_model_dir), *settings])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert [row["round"] for row in result["rounds"]] == [1, 2]
    assert (result["reward"], result["eval_prompts"], result["eval_answers"]) == ("model", 4, 2)
    # round 2's top-up is chosen by round 1's reward model, as the app's generate button would choose it
    assert "chosen by the reward model at" in captured.err
    row_keys = {"round", "rm_accuracy", "reward", "kl", "win_rate", "win_rate_low", "win_rate_high", "wins", "losses",
                "ties", "judge_score", "judge_score_se", "rm_score", "rm_score_first", "round_seconds", "seconds",
                "policy_id", "promoted_at_round_end", "promoted", "promotion_rule", "current_policy_id",
                "current_win_rate", "current_win_rate_low", "current_win_rate_high"}
    oracle_keys = {"oracle_win_rate", "oracle_win_rate_low", "oracle_win_rate_high", "oracle_wins", "oracle_losses",
                   "oracle_ties", "oracle_judge_score", "oracle_judge_score_se", "oracle_kl"}

    def check_row(row, prefixes=("",), answers=8):
        for prefix in prefixes:
            assert row[prefix + "wins"] + row[prefix + "losses"] + row[prefix + "ties"] == answers  # prompts x answers
            assert row[prefix + "win_rate"] == (row[prefix + "wins"] + 0.5 * row[prefix + "ties"]) / answers
            assert 0 <= row[prefix + "win_rate_low"] <= row[prefix + "win_rate"] <= row[prefix + "win_rate_high"] <= 1
            assert row[prefix + "judge_score"] > 0  # `longer` scores an answer by its words: their mean
            assert row[prefix + "judge_score_se"] >= 0
        assert isinstance(row["rm_score"], float) and isinstance(row["rm_score_first"], float)
        # the round's own seconds leave out the votes and the judging around it
        assert 0 < row["round_seconds"] < row["seconds"]

    for row in result["rounds"]:
        assert set(row) == row_keys
        check_row(row)
        # promotion.rule = "always" (tiny_settings): every policy is current after its round, its win rate the same
        assert (row["promoted"], row["promotion_rule"], row["current_policy_id"]) == (True, "always", row["policy_id"])
        assert row["current_win_rate"] == row["win_rate"]
    assert result["first_judge_score"] > 0 and result["first_judge_score_se"] >= 0
    printed = out.strip().splitlines()[0]
    assert "95% CI" in printed and "reward-model score" in printed
    store = Store(db)
    assert [p.round for p in store.policies()] == [0, 1, 2]
    assert len(store.votes(annotator="sim:longer")) == 16 + 8  # two rounds' and the closing votes
    # votes graded by the rule's own score (`longer`: words), as a person says "much" or "slightly" better
    assert all(score is not None and score("one two three") == 3.0 for score in vote_scores)
    assert [r.status for r in store.rounds()] == ["done", "done"]
    # the same database again, with the oracle's ceiling: its rows go on from the database's round 3, not from 1
    code = app.main(["--demo-loop", "--rounds", "1", "--annotator", "longer", "--votes", "8", "--eval-prompts", "4",
                     "--oracle-ceiling", "--db", str(db), "--model", str(tiny_model_dir), *settings])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert [row["round"] for row in result["rounds"]] == [3]
    assert result["first_policy_id"] == store.first_policy().id  # judged against round 0, not round 2's policy
    assert set(result["rounds"][0]) == row_keys | oracle_keys
    check_row(result["rounds"][0], ("", "oracle_"), answers=4)
    assert result["rounds"][0]["oracle_kl"] is not None
    assert "oracle ceiling: win rate" in out.strip().splitlines()[0]
    # --seed 0 plus the database's rounds: the second run does not repeat the first; each run's last seed is its
    # closing votes', and round 3 casts none, its votes being the first run's closing ones
    assert vote_seeds == [1, 2, 3, 4]
    third = store.rounds()[2]
    ceiling = Path(third.metrics["round/ceiling_policy_path"])
    assert ceiling.name == "ceiling-policy" and (ceiling / "config.json").is_file()
    assert [p.round for p in store.policies()] == [0, 1, 2, 3]  # the ceiling's policy is a folder, not a policy
    assert store.latest_policy().path == third.metrics["round/policy_path"] != str(ceiling)
    # each stage is timed; the round's own seconds are its run less the ceiling, a demo measurement
    stages = [third.metrics[f"round/{stage}_seconds"] for stage in ("reward", "ppo", "ceiling", "pairs")]
    assert all(seconds > 0 for seconds in stages) and sum(stages) <= third.metrics["round/seconds"]
    assert result["rounds"][0]["round_seconds"] == pytest.approx(
        third.metrics["round/seconds"] - third.metrics["round/ceiling_seconds"], abs=0.1)
    assert "round/ceiling_seconds" not in store.rounds()[0].metrics  # no ceiling, nothing to leave out
    # every policy of both runs was answered on the same four prompts: run 1 the first policy and rounds 1-2; run 2
    # the first policy (round 0 again), round 3, its ceiling, and round 2's policy for round 3's report (its actor)
    assert len(judged_prompts) == 1 + 2 + 1 + 1 + 1 + 1
    assert all(prompts == judged_prompts[0][1] for _path, prompts in judged_prompts)
    assert len(set(judged_prompts[0][1])) == 4


def test_the_demos_closing_votes_let_people_decide_its_last_rounds_promotion(tmp_path, tiny_model_dir, capsys):
    """Without them the last round's versus pairs are never voted on and the reward model decides it alone; with
    them people do, and a demo on the same database counts them as its first round's votes."""
    import json

    from annotate.promotion import PromotionDecision

    def demo(db, *flags):
        settings = [*tiny_settings(tmp_path), "promotion.rule=evidence", "promotion.min_votes=2",
                    "promotion.max_kl=0", "round.versus_share=0.5", *flags]
        code = app.main(["--demo-loop", "--rounds", "1", "--annotator", "longer", "--votes", "8", "--eval-prompts",
                         "2", "--db", str(db), "--model", str(tiny_model_dir),
                         *[arg for setting in settings for arg in ("--set", setting)]])
        assert code == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    without = demo(tmp_path / "without.db", "simulate.closing_votes=false")
    assert without["closing_votes"] == 0
    assert without["rounds"][0]["promotion_rule"] == "reward model"  # "0 of 2 votes on its versus pairs so far"
    assert len(Store(tmp_path / "without.db").votes()) == 8
    db = tmp_path / "with.db"
    result = demo(db)
    assert result["closing_votes"] == 8
    store = Store(db)
    last = store.policy(result["rounds"][0]["policy_id"])
    decision = PromotionDecision.from_json(last.promotion)
    assert (result["rounds"][0]["promotion_rule"], decision.rule) == ("people", "people")
    versus = [vote for vote in store.versus_votes() if (vote.policy_id, vote.opponent_id) == (last.id, last.parent_id)]
    assert len(versus) >= 2 and decision.numbers["judged"] >= 2  # the closing votes judged its versus pairs
    assert len(store.votes()) == 16 and store.votes_since_last_round() == 8
    demo(db, "simulate.closing_votes=false")  # round 2 trains on the closing votes and casts none of its own
    assert len(store.votes()) == 16 and store.rounds()[-1].status == "done"


def test_head_to_head_counts_wins_losses_and_ties_with_sides_alternated():
    from annotate.simulate import longer
    from loop.judging import head_to_head

    prompts = ["p1", "p2", "p3", "p4", "p5"]
    new = ["a long answer", "a long answer", "same", "x", "longer one"]
    first = ["short", "short", "same", "a longer one", "x"]
    # new on side a for rows 0, 2, 4 and on side b for 1, 3: wins at 0, 1, 4; tie at 2; loss at 3
    result = head_to_head(longer, prompts, new, first)
    # scores [1, 1, 0.5, 0, 1]: mean 0.7, standard error 0.2 (as in the test below), interval 0.7 +- 0.392
    assert result == pytest.approx({"win_rate": (3 + 0.5) / 5, "win_rate_low": 0.308, "win_rate_high": 1.0,
                                    "wins": 3, "losses": 1, "ties": 1})


def test_the_win_rate_oracle_gives_the_share_of_first_answers_an_answer_beats_ties_half():
    from annotate.simulate import RULE_SCORES, longer
    from loop.judging import head_to_head, win_rate_reward

    first = ["a", "a b", "a b", "a b c d e"]  # the rule "longer" scores them 1, 2, 2, 5 words
    reward = win_rate_reward(RULE_SCORES["longer"], first, "longer")
    texts = ["x y", "one two three four five six", "", "p q r", "v w x y z"]
    # 2 words: beats 1, ties 2 -> (1 + 1) / 4; 6: all 4; 0: none; 3: 3 of 4; 5: beats 3, ties 1 -> 3.5 / 4
    assert reward(texts) == [0.5, 1.0, 0.0, 0.75, 0.875]
    # its mean over answers is their win rate against every first answer, each pair judged as the demo judges
    pairs = [(text, old) for text in texts for old in first]
    pooled = head_to_head(longer, ["p"] * len(pairs), [t for t, _ in pairs], [o for _, o in pairs])["win_rate"]
    assert sum(reward(texts)) / len(texts) == pytest.approx(pooled)
    with pytest.raises(ValueError, match="needs the first policy's answers"):
        win_rate_reward(RULE_SCORES["longer"], [], "longer")


def test_mean_standard_error_and_win_rate_interval_worked_by_hand():
    from annotate.statistics import mean_and_standard_error, win_rate_interval

    scores = [1, 1, 1, 0.5, 0]  # 3 wins, a tie, a loss
    # mean 0.7; squared deviations 3 * 0.09 + 0.04 + 0.49 = 0.8; variance 0.8 / 4 = 0.2; error sqrt(0.2 / 5) = 0.2
    assert mean_and_standard_error(scores) == pytest.approx((0.7, 0.2))
    low, high = win_rate_interval(scores)
    assert (low, high) == pytest.approx((0.7 - 1.96 * 0.2, 1.0))  # 1.092 clipped to 1
    # two answers a prompt: the prompts' means [0.5, 1, 0.5, 0.5], mean 0.625, variance (3 * 0.015625 + 0.140625) / 3
    # = 0.0625, error 0.25 / sqrt(4) = 0.125 (the eight scores as independent draws: 0.157)
    paired = [1, 0, 1, 1, 0.5, 0.5, 0, 1]
    assert mean_and_standard_error(paired, per_group=2) == pytest.approx((0.625, 0.125))
    assert win_rate_interval(paired, per_prompt=2) == pytest.approx((0.625 - 0.245, 0.625 + 0.245))
    # 20 wins, 20 losses, 24 ties: mean 0.5, variance 40 * 0.25 / 63, error sqrt(10 / 63 / 64) = 0.0498
    even = [1] * 20 + [0] * 20 + [0.5] * 24
    assert win_rate_interval(even) == pytest.approx((0.5 - 1.96 * 0.04980, 0.5 + 1.96 * 0.04980), abs=1e-4)
    assert win_rate_interval([0.5] * 64) == (0.5, 0.5)  # all ties: no spread (Wilson would say 0.5 +- 0.12)
    assert mean_and_standard_error([0.4]) == (0.4, None) and win_rate_interval([1.0]) == (0.0, 1.0)
    assert mean_and_standard_error([]) == (None, None)


def test_mean_score_averages_the_rules_score_and_is_none_for_a_verdict_only_annotator():
    from annotate.simulate import resolve_score
    from loop.judging import mean_score

    answers = ["Thank you, I hope this helps", "plain words here", "please"]
    # courtesy shares: thank + hope of 6 words = 1/3, 0 of 3, 1 of 1 -> mean (1/3 + 0 + 1) / 3 = 4/9
    assert mean_score(resolve_score("courteous"), answers) == pytest.approx(4 / 9)
    assert mean_score(resolve_score("longer"), answers) == pytest.approx((6 + 3 + 1) / 3)
    assert mean_score(resolve_score("contains:plain"), answers) == pytest.approx(1 / 3)
    assert resolve_score("my_rules:warmth") is None
    assert mean_score(None, answers) is None
    assert mean_score(resolve_score("courteous"), []) is None


def test_an_oracle_needs_an_annotator_with_a_score_and_is_refused_before_touching_the_database(tmp_path, capsys,
                                                                                              monkeypatch):
    (tmp_path / "verdicts_only.py").write_text("def judge(prompt, a, b):\n    return 'a'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "demo.db"
    for flag in (["--reward", "oracle"], ["--oracle-ceiling"]):
        code = app.main(["--demo-loop", "--annotator", "verdicts_only:judge", *flag, "--db", str(db)])
        assert code == 2
        err = capsys.readouterr().err
        assert f"error: {flag[0]}" in err and "'verdicts_only:judge' has none" in err and "--reward model" in err
    assert app.main(["--demo-loop", "--reward", "oracle", "--oracle-ceiling", "--db", str(db)]) == 2
    assert "oracle_ceiling compares the reward model's rounds with the oracle's" in capsys.readouterr().err
    assert not db.exists()


def test_demo_loop_refuses_zero_evaluation_answers_before_touching_the_database(tmp_path, capsys):
    db = tmp_path / "demo.db"
    code = app.main(["--demo-loop", "--eval-answers", "0", "--db", str(db)])
    assert code == 2
    assert "app.py: --eval-answers: simulate.eval_answers must be at least 1 (the win rate needs answers to judge), " \
        "not 0" in capsys.readouterr().err
    assert not db.exists()


def test_demo_loop_fills_its_queue_past_one_pair_a_prompt(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """A call makes at most one pair a prompt: asking for more votes than the database has prompts takes more calls
    (on the least-used prompts), so a round gets the votes it was asked for; none on the evaluation prompt."""
    from collections import Counter

    import loop.round
    from loop.checks import RoundRefused

    def refuse(*args, **kwargs):
        raise RoundRefused("stop after the votes")

    monkeypatch.setattr(loop.round, "run_round", refuse)
    db = tmp_path / "demo.db"
    store = Store(db)
    store.add_prompts(PROMPTS[:5], source="test")
    store.close()
    settings = [arg for setting in tiny_settings(tmp_path) for arg in ("--set", setting)]
    code = app.main(["--demo-loop", "--rounds", "1", "--annotator", "longer", "--votes", "12", "--eval-prompts", "1",
                     "--eval-answers", "1", "--db", str(db), "--model", str(tiny_model_dir), *settings])
    assert code != 0 and "stop after the votes" in capsys.readouterr().err
    store = Store(db)
    votes = store.votes(annotator="sim:longer")
    assert len(votes) == 12  # 5 prompts, 1 kept to judge the policies on: three calls of 4 pairs
    assert store.count_prompts() == 5
    pairs_a_prompt = Counter(store.pair(vote.pair_id).prompt_id for vote in votes)
    assert sorted(pairs_a_prompt.values()) == [3, 3, 3, 3]  # the fifth, the evaluation prompt, has none


def test_a_report_that_fails_is_said_and_the_round_still_finishes(tmp_path, tiny_model_dir, monkeypatch):
    import loop.report

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(loop.report, "make_round_report", broken)
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    said = []
    result = run_round(db, str(tiny_model_dir), load_config(None, tiny_settings(tmp_path)), log=said.append)
    with Store(db) as store:
        assert store.round(result.round_id).status == "done" and store.round_report(result.round_id) is None
        assert store.round(result.round_id).metrics["round/pairs_generated"] > 0
    message = f"its report was not made (OSError: disk full); make it with python app.py --report {result.round_id}."
    assert any(line.endswith(message) for line in said)
