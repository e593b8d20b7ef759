"""Making pairs: which prompts, how many pairs of each kind, who wrote which side, what gets skipped."""

import random

import pytest

import app
from annotate.metrics import ROUND_POLICY_ID, ROUND_PPO_PROMPTS
from annotate.records import Prompt
from annotate.store import Store
from loop.pair_request import PairProgress, PairRequest, PairsReport, earlier_policy, usable, versus_prompt_ids
from loop.pairs import make_pairs
from loop.policies import PolicyModel
from rlhf.generate import Answer
from rlhf.models import build_tiny_model
from rlhf.sampling import Sampling

# The tiny model's random output matrix makes peaked draws: at temperature 1 two samples of a prompt are often the
# same text (a skipped pair); at 3 they practically never are.
SHORT = Sampling(max_new_tokens=4, temperature=3.0)


def short(n_pairs: int, policy_id: int, **settings) -> PairRequest:
    """n_pairs pairs of short answers at temperature 3, 8 sequences a batch."""
    return PairRequest(n_pairs, policy_id, **{"sampling": SHORT, "batch_size": 8, **settings})


@pytest.fixture()
def store():
    with Store(":memory:") as store:
        store.add_prompts([f"Question number {i}?" for i in range(1, 7)], source="test")
        yield store


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, real_tokenizer):
    """A second tiny model with other random weights: the 'earlier policy' of versus pairs."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-other"), real_tokenizer, seed=1)


def pair_rows(store):
    """(prompt_id, kind, policy of gen_a, policy of gen_b) for every stored pair."""
    rows = []
    for pair_id in range(1, store.count_pairs() + 1):
        pair = store.pair(pair_id)
        a, b = store.generation(pair.gen_a), store.generation(pair.gen_b)
        assert a.prompt_id == b.prompt_id == pair.prompt_id
        rows.append((pair.prompt_id, pair.kind, a.policy_id, b.policy_id))
    return rows


def test_first_start_records_the_base_model_once(store):
    base = store.ensure_base_policy("default")
    assert (base.round, base.path, base.parent_id) == (0, "default", None)
    assert store.ensure_base_policy("some/other-model") == base
    assert len(store.policies()) == 1


def test_sample_pairs_go_to_the_prompts_with_fewest_pairs(store, tiny_model, tokenizer):
    base = store.ensure_base_policy("tiny")
    first = make_pairs(store, short(4, base.id, seed=0), PolicyModel(tiny_model, tokenizer))
    second = make_pairs(store, short(4, base.id, seed=1), PolicyModel(tiny_model, tokenizer))

    assert (first.written, first.sample, first.versus) == (4, 4, 0)
    assert (second.written, second.sample, second.versus) == (4, 4, 0)
    # Prompts 1-4 first; then the two without a pair (5, 6), then the oldest of those with one (1, 2).
    assert sorted(row[0] for row in pair_rows(store)) == [1, 1, 2, 2, 3, 4, 5, 6]
    assert {row[1:] for row in pair_rows(store)} == {("sample", base.id, base.id)}
    assert store.stats()["generations"] == 16
    assert first.stats["gen/answers"] == 8 and first.stats["gen/finished_share"] == 0.0


def test_stored_answers_keep_their_token_counts_and_finish_reason(store, tiny_model, tokenizer):
    base = store.ensure_base_policy("tiny")
    make_pairs(store, short(1, base.id, seed=0), PolicyModel(tiny_model, tokenizer))
    pair = store.pair(1)
    for generation in (store.generation(pair.gen_a), store.generation(pair.gen_b)):
        assert (generation.n_tokens, generation.finish_reason) == (4, "length")
        assert generation.text


def test_versus_pairs_put_the_newer_policy_on_side_a(store, tiny_model, tokenizer, other_model_dir):
    base = store.ensure_base_policy(str(other_model_dir))
    newer_id = store.add_policy(round=1, path="checkpoints/round-1", parent_id=base.id)
    report = make_pairs(store, short(4, newer_id, versus_share=0.5, seed=0), PolicyModel(tiny_model, tokenizer))

    assert (report.written, report.sample, report.versus) == (4, 2, 2)
    assert report.versus_policy_id == base.id
    rows = pair_rows(store)
    assert sorted(row[1:] for row in rows) == [
        ("sample", newer_id, newer_id), ("sample", newer_id, newer_id),
        ("versus", newer_id, base.id), ("versus", newer_id, base.id),
    ]
    assert sorted(row[0] for row in rows) == [1, 2, 3, 4]


def test_versus_prompts_are_drawn_among_those_ppo_did_not_train_on_else_among_all():
    prompts = [Prompt(id=i, text=f"q{i}", source="test", created_at="") for i in range(1, 7)]
    trained = frozenset({"q1", "q2", "q3", "q4"})
    assert versus_prompt_ids(random.Random(0), prompts, 2, trained) == {5, 6}
    assert versus_prompt_ids(random.Random(0), prompts, 3, trained) == {5, 6}  # fewer: only two held out
    assert versus_prompt_ids(random.Random(0), prompts, 1, frozenset()) <= {1, 2, 3, 4, 5, 6}
    everything = frozenset(p.text for p in prompts)
    assert len(versus_prompt_ids(random.Random(0), prompts, 3, everything)) == 3  # all trained on: drawn among all


def test_mixed_batch_puts_its_versus_pairs_on_prompts_the_newer_policy_was_not_trained_on(store, tiny_model, tokenizer,
                                                                                          other_model_dir, capsys):
    base = store.ensure_base_policy(str(other_model_dir))
    newer_id = store.add_policy(round=1, path="checkpoints/round-1", parent_id=base.id)
    round_id = store.start_round()
    store.finish_round(round_id, {ROUND_POLICY_ID.name: newer_id,
                                  ROUND_PPO_PROMPTS: [f"Question number {i}?" for i in range(1, 6)]})
    report = make_pairs(store, short(6, newer_id, versus_share=0.5, seed=0), PolicyModel(tiny_model, tokenizer))

    assert (report.versus, report.sample) == (1, 5)  # 3 wanted, 1 prompt (6) held out
    assert [row[0] for row in pair_rows(store) if row[1] == "versus"] == [6]
    assert "1 versus pairs of 3 wanted" in capsys.readouterr().err


def test_without_an_earlier_policy_every_pair_is_a_sample_pair(store, tiny_model, tokenizer, capsys):
    base = store.ensure_base_policy("tiny")
    report = make_pairs(store, short(3, base.id, versus_share=1.0, seed=0), PolicyModel(tiny_model, tokenizer))
    assert (report.written, report.sample, report.versus) == (3, 3, 0)
    assert "making sample pairs only" in capsys.readouterr().err


def test_identical_answers_make_no_pair(store, tiny_model, tokenizer):
    base = store.ensure_base_policy("tiny")
    greedy = Sampling(max_new_tokens=4, temperature=0.0)  # both answers to a prompt come out the same
    report = make_pairs(store, PairRequest(3, base.id, sampling=greedy, seed=0), PolicyModel(tiny_model, tokenizer))
    assert (report.written, report.skipped_identical) == (0, 3)
    assert store.count_pairs() == 0 and store.stats()["generations"] == 0


def test_empty_or_identical_answers_are_not_usable():
    report = PairsReport()
    hello, other, empty = Answer("Hello", 1, "stop"), Answer("Hi!", 2, "stop"), Answer("", 0, "stop")
    assert usable(hello, other, report)
    assert not usable(hello, Answer("Hello", 1, "stop"), report)
    assert not usable(empty, hello, report) and not usable(hello, empty, report)
    assert (report.skipped_identical, report.skipped_empty) == (1, 2)


def test_progress_is_reported_per_prompt_with_its_pair_already_stored(store, tiny_model, tokenizer):
    base = store.ensure_base_policy("tiny")
    calls = []

    class Recorded(PairProgress):
        def pairs(self, done, total, written):
            calls.append((done, total, store.count_pairs()))

    request = PairRequest(5, base.id, sampling=Sampling(max_new_tokens=2, temperature=3.0), seed=0,
                          batch_size=4)  # 2 prompts per batch
    make_pairs(store, request, PolicyModel(tiny_model, tokenizer), Recorded())
    assert calls == [(done, 5, done) for done in range(1, 6)]  # each pair is in the store when its prompt counts


def test_the_earlier_policy_is_the_parent_or_else_the_last_of_an_earlier_round(store):
    base_id = store.add_policy(round=0, path="base")
    sft_id = store.add_policy(round=0, path="sft", parent_id=base_id)
    round_1 = store.add_policy(round=1, path="r1", parent_id=sft_id)
    orphan = store.add_policy(round=2, path="r2")
    assert earlier_policy(store, store.policy(round_1)).id == sft_id
    assert earlier_policy(store, store.policy(orphan)).id == round_1
    assert earlier_policy(store, store.policy(base_id)) is None


def generate_argv(db, model, n, *extra):
    """`app.py --generate-pairs N` on `db` with `model`, answers of at most 4 tokens."""
    return ["--generate-pairs", str(n), "--db", str(db), "--model", str(model), "--max-new-tokens", "4", *extra]


def test_generate_pairs_command_uses_the_base_model_on_a_fresh_database(tmp_path, tiny_model_dir, capsys):
    with Store(tmp_path / "loop.db") as store:
        store.add_prompts(["Hi?", "Why?", "How?"])
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, 2)) == 0

    with Store(tmp_path / "loop.db") as store:
        (policy,) = store.policies()
        assert (policy.round, policy.path) == (0, str(tiny_model_dir))
        assert store.count_pairs() == 2 and store.pairs_waiting() == 2
    assert "2 pairs written" in capsys.readouterr().out


def test_the_pair_child_says_what_it_does_and_counts_every_answer(tmp_path, tiny_model_dir, capsys):
    # --progress-lines: what the app's child prints for the app's status line (loop.children.pair_child)
    with Store(tmp_path / "loop.db") as store:
        store.add_prompts(["Hi?", "Why?", "How?"])
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, 3, "--progress-lines")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["pairs-stage loading the model", "pairs-stage generating"]
    assert [line for line in lines if line.startswith("pairs-answers")] == [f"pairs-answers {n} 6" for n in range(1, 7)]
    assert [line for line in lines if line.startswith("pairs-progress")] == [f"pairs-progress {n} 3" for n in (1, 2, 3)]
    assert lines[-1].startswith("pairs-written ")  # identical answers (the tiny model draws few words) are skipped


@pytest.mark.parametrize("n, extra, message", [
    ("zero", [], "N must be a positive whole number"),
    ("0", [], "N must be a positive whole number"),
    ("2", ["--versus-share", "1.5"], "--versus-share must lie between 0 and 1"),
    ("2", ["--set", "votes.oversample=many"], "votes.oversample"),
])
def test_generate_pairs_command_refuses_bad_numbers(tmp_path, tiny_model_dir, capsys, n, extra, message):
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, n, *extra)) == 2
    assert message in capsys.readouterr().err


def test_generate_pairs_command_chooses_sample_pairs_with_the_last_rounds_reward_model(tmp_path, tiny_model_dir,
                                                                                       capsys):
    from rlhf.reward.data import PreferencePair
    from rlhf.reward.strategies import StrategyConfig, VotesConfig, train_strategy

    pairs = [PreferencePair(f"Tell me about tea #{i}.", "Thank you, happy to help: it is lovely.", f"Tea {i}.")
             for i in range(12)]
    path = train_strategy("head", pairs, str(tiny_model_dir),
                          StrategyConfig(votes=VotesConfig(n_heads=4, cv_folds=3))).save(tmp_path / "reward")
    with Store(tmp_path / "loop.db") as store:
        store.add_prompts([f"Question {i}?" for i in range(6)])
        store.finish_round(store.start_round(), {"round/reward_model_path": str(path)})
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, 2)) == 0
    captured = capsys.readouterr()
    assert "least sure about" in captured.err and str(path) in captured.err
    assert "2 pairs written" in captured.out
    with Store(tmp_path / "loop.db") as store:
        assert store.count_pairs() == 2
    # votes.oversample=2 turns the choice off
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, 2, "--set", "votes.oversample=2")) == 0
    assert "least sure about" not in capsys.readouterr().err


def test_generate_pairs_command_without_prompts_says_how_to_import_them(tmp_path, tiny_model_dir, capsys):
    assert app.main(generate_argv(tmp_path / "loop.db", tiny_model_dir, 2)) == 2
    assert "--import-prompts" in capsys.readouterr().err


def test_one_seed_gives_the_same_pairs(tiny_model, tokenizer):
    texts = []
    for _ in range(2):
        with Store(":memory:") as store:
            store.add_prompts(["One?", "Two?", "Three?"])
            base = store.ensure_base_policy("tiny")
            request = PairRequest(3, base.id, sampling=Sampling(max_new_tokens=3, temperature=1.0), seed=5)
            make_pairs(store, request, PolicyModel(tiny_model, tokenizer))
            texts.append([store.generation(g).text for g in range(1, 7)])
    assert texts[0] == texts[1]
