"""The one path that queues pairs for votes: random before a reward model exists, chosen by its heads after."""

import torch

from annotate.metrics import ROUND_POLICY_ID, ROUND_PPO_PROMPTS
from annotate.store import Store
from loop.pair_request import PairProgress, PairRequest
from loop.pairs import queue_pairs
from loop.policies import load_pair_judge, pair_judge_path
from rlhf.reward.strategies import HEADS_FILE, VotesConfig
from rlhf.sampling import Sampling

SAMPLING = Sampling(max_new_tokens=6)


class LengthDoubt:
    """A stand-in judge: unsure about answers of similar length (disagreement 1 / (1 + length difference))."""

    def __init__(self):
        self.calls = 0

    def disagreement(self, prompts, answers_a, answers_b):
        self.calls += 1
        return torch.tensor([1.0 / (1 + abs(len(a) - len(b))) for a, b in zip(answers_a, answers_b)])


def store_with_two_policies(tiny_model_dir, n_prompts=12, db=":memory:"):
    store = Store(db)
    store.add_prompts([f"Question number {i}?" for i in range(n_prompts)], source="test")
    base = store.ensure_base_policy(str(tiny_model_dir))
    newer = store.policy(store.add_policy(1, str(tiny_model_dir), parent_id=base.id))
    return store, base, newer


def test_without_a_judge_pairs_are_two_random_answers_a_prompt(tiny_model_dir):
    store, _base, newer = store_with_two_policies(tiny_model_dir)
    report = queue_pairs(store, PairRequest(4, newer.id, sampling=SAMPLING, seed=0), VotesConfig(), judge=None)
    assert report.written == store.count_pairs() == 4
    assert [store.pair(i).chosen_by for i in range(1, 5)] == ["random"] * 4  # recorded, for held-out accuracy
    assert "active/uncertain" not in report.stats
    assert report.stats["gen/answers"] == 8  # two answers a pair, nothing over-sampled


def test_with_a_judge_sample_pairs_come_from_over_sampled_answers_and_versus_pairs_stay(tiny_model_dir):
    store, base, newer = store_with_two_policies(tiny_model_dir)
    judge = LengthDoubt()
    calls = []

    class Recorded(PairProgress):
        def pairs(self, done, total, written):
            calls.append((done, total))

    votes = VotesConfig(oversample=4, prompts_per_pair=1.5, random_share=0.0)
    request = PairRequest(4, newer.id, versus_share=0.5, versus_policy_id=base.id, sampling=SAMPLING, seed=0)
    report = queue_pairs(store, request, votes, judge=judge, progress=Recorded())
    pairs = [store.pair(pair_id) for pair_id in range(1, store.count_pairs() + 1)]
    assert [p.kind for p in pairs].count("versus") == report.versus == 2  # round(4 * 0.5)
    assert sorted((p.kind, p.chosen_by) for p in pairs) == [  # random_share 0: every sample pair for disagreement
        ("sample", "uncertain"), ("sample", "uncertain"), ("versus", None), ("versus", None)]
    assert report.sample == 2 and report.written == 4
    assert judge.calls == 1
    # the sample pairs: 3 prompts (ceil(2 * 1.5)) x 4 answers over-sampled, both chosen for disagreement
    assert report.stats["active/candidate_answers"] == 12
    assert report.stats["active/uncertain"] == 2
    assert report.stats["gen/answers"] == 12 + 2 * 2  # plus both policies' answers to the 2 versus prompts
    assert {total for _done, total in calls} == {4}
    assert [done for done, _total in calls] == sorted(done for done, _total in calls) and calls[-1] == (4, 4)


def trained_on(store, policy, prompt_texts):
    """A finished round that saved `policy` after PPO on `prompt_texts` (what round_plan records)."""
    round_id = store.start_round()
    store.finish_round(round_id, {ROUND_POLICY_ID.name: policy.id, ROUND_PPO_PROMPTS: list(prompt_texts)})


def test_with_a_judge_versus_pairs_go_to_prompts_the_newer_policy_was_not_trained_on(tiny_model_dir, capsys):
    store, base, newer = store_with_two_policies(tiny_model_dir)
    trained_on(store, newer, [f"Question number {i}?" for i in range(9)])  # 9 of 12: 3 held out
    votes = VotesConfig(oversample=4, prompts_per_pair=1.5, random_share=0.0)
    request = PairRequest(8, newer.id, versus_share=0.5, versus_policy_id=base.id, sampling=SAMPLING, seed=0)
    report = queue_pairs(store, request, votes, judge=LengthDoubt())
    pairs = [store.pair(pair_id) for pair_id in range(1, store.count_pairs() + 1)]
    versus_prompts = [store.prompt(p.prompt_id).text for p in pairs if p.kind == "versus"]
    assert sorted(versus_prompts) == sorted(f"Question number {i}?" for i in (9, 10, 11))  # 3 of 4 wanted: all left
    assert report.versus == 3 and report.sample == 4
    assert "3 versus pairs of 4 wanted" in capsys.readouterr().err


def test_when_every_prompt_was_trained_on_versus_pairs_still_come(tiny_model_dir):
    store, base, newer = store_with_two_policies(tiny_model_dir, n_prompts=4)
    trained_on(store, newer, [f"Question number {i}?" for i in range(4)])
    votes = VotesConfig(oversample=4, prompts_per_pair=1.5, random_share=0.0)
    request = PairRequest(4, newer.id, versus_share=0.5, versus_policy_id=base.id, sampling=SAMPLING, seed=0)
    assert queue_pairs(store, request, votes, judge=LengthDoubt()).versus == 2


def test_oversample_two_turns_the_choice_off_even_with_a_judge(tiny_model_dir):
    store, _base, newer = store_with_two_policies(tiny_model_dir)
    judge = LengthDoubt()
    report = queue_pairs(store, PairRequest(3, newer.id, sampling=SAMPLING, seed=0), VotesConfig(oversample=2),
                         judge=judge)
    assert judge.calls == 0 and report.written == 3 and "active/uncertain" not in report.stats


def test_the_pair_judge_is_the_last_finished_rounds_reward_model_with_heads(tmp_path):
    store = Store(":memory:")
    assert pair_judge_path(store) is None  # before any round
    with_heads, without = tmp_path / "round-1" / "reward", tmp_path / "round-2" / "reward"
    with_heads.mkdir(parents=True)
    without.mkdir(parents=True)
    (with_heads / HEADS_FILE).write_bytes(b"")
    first = store.start_round()
    store.finish_round(first, {"round/reward_model_path": str(with_heads)})
    assert pair_judge_path(store) == str(with_heads)
    second = store.start_round()
    store.update_round_metrics(second, {"round/reward_model_path": str(without)})
    assert pair_judge_path(store) == str(with_heads)  # a running round's model is not finished yet
    store.finish_round(second, {"round/reward_model_path": str(without)})
    assert pair_judge_path(store) is None  # the latest finished model has no heads (e.g. trained elsewhere)
    assert load_pair_judge(str(without), VotesConfig()) is None
    assert load_pair_judge(str(with_heads), VotesConfig(oversample=2)) is None  # the choice is off: nothing loaded


def test_the_apps_generator_chooses_sample_pairs_with_the_last_rounds_reward_model(tiny_model_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    """The app makes pairs with a child `app.py --generate-pairs N --progress-lines --config FILE` (loop.app_server);
    the same command runs here in this process, so the judge's calls can be counted."""
    import app
    from loop.config import LoopConfig
    from loop.app_server import child_command, write_child_config
    from rlhf.reward.data import PreferencePair
    from rlhf.reward.strategies import StrategyConfig, TrainedPreferenceModel, train_strategy

    db = tmp_path / "loop.db"
    store, _base, _newer = store_with_two_policies(tiny_model_dir, db=db)
    config = LoopConfig()
    config.app.db, config.app.model = str(db), str(tiny_model_dir)
    config.sampling = SAMPLING  # short answers: seconds, not minutes
    argv = child_command(write_child_config(config), config, "--generate-pairs", "2", "--versus-share", "0.0",
                         "--progress-lines")[2:]  # what the app's ChildProcessPairGenerator runs, less the python
    pairs = [PreferencePair(f"Tell me about tea #{i}.", "Thank you, happy to help: it is lovely.", f"Tea {i}.")
             for i in range(12)]
    model = train_strategy("head", pairs, str(tiny_model_dir),
                           StrategyConfig(votes=VotesConfig(n_heads=4, cv_folds=3)))
    path = model.save(tmp_path / "reward")
    asked = []
    disagreement = TrainedPreferenceModel.disagreement
    monkeypatch.setattr(TrainedPreferenceModel, "disagreement",
                        lambda self, prompts, a, b: asked.append(len(prompts)) or disagreement(self, prompts, a, b))
    monkeypatch.chdir(tmp_path)  # no rlhf-loop.toml but the app's own file

    capsys.readouterr()
    assert app.main(argv) == 0
    assert "pairs-written 2" in capsys.readouterr().out.splitlines()
    assert asked == []  # no finished round yet: random pairs
    round_id = store.start_round()
    store.finish_round(round_id, {"round/reward_model_path": str(path)})
    assert app.main(argv) == 0
    captured = capsys.readouterr()
    assert "pairs-written 2" in captured.out.splitlines()
    assert "least sure about" in captured.err and str(path) in captured.err
    assert asked == [3 * 6]  # ceil(2 * 1.5) prompts x 6 candidate pairs of 4 answers, ranked by the heads
    assert store.count_pairs() == 4
