"""The annotation app's handlers, called as plain functions (no browser, no server): votes, skips, double submits,
the empty queue, admin checks, rounds started as child processes, the dashboard's numbers, serve's refusals."""

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from loop.children.pair_job import GenerationJob
from annotate.records import NewGeneration, NewPair
from loop.children.round_runner import RoundRunner
from annotate.store import Store
from annotate.ui import build_app
from annotate.ui_annotate import AnnotateHandlers
from annotate.ui_admin import AdminHandlers
from annotate.statistics import wilson_interval
from annotate.ui_dashboard import DashboardHandlers
from annotate.ui_session import AppConfig, Session, escape, render_untrusted


class FakeGenerator:
    """Writes pairs of canned answers, as the real one does through make_pairs."""

    def __init__(self, store: Store, seconds_per_pair: float = 0.0):
        self.store = store
        self.seconds_per_pair = seconds_per_pair
        self.calls = []

    def generate(self, n_pairs, versus_share, progress):
        self.calls.append((n_pairs, versus_share))
        policy = self.store.latest_policy() or self.store.policy(self.store.add_policy(0, "fake"))
        prompts = self.store.prompts_needing_pairs(n_pairs)
        for done, prompt in enumerate(prompts, start=1):
            time.sleep(self.seconds_per_pair)
            self.store.add_pairs_bulk([NewPair(prompt.id, NewGeneration(policy.id, f"fake A {done}", 3, "eos"),
                                               NewGeneration(policy.id, f"fake B {done}", 3, "eos"))])
            progress(done, n_pairs)
        return len(prompts)


def seed_pairs(store: Store, n: int) -> None:
    """n prompts 'Prompt i', each with one pair: gen_a 'first answer i', gen_b 'second answer i'."""
    store.add_prompts([f"Prompt {i}" for i in range(1, n + 1)])
    policy = store.add_policy(0, "base")
    store.add_pairs_bulk([
        NewPair(p.id, NewGeneration(policy, f"first answer {i}", 3, "eos"), NewGeneration(policy, f"second answer {i}", 3, "eos"))
        for i, p in enumerate(store.prompts(), 1)
    ])


def idle_runner(store: Store) -> RoundRunner:
    """A round runner whose "round" only prints a line (a stand-in for `app.py --train-round`)."""
    return RoundRunner(store, [sys.executable, "-c", "print('round')"])


@pytest.fixture
def app_parts():
    """A store with 3 pairs and the three handler objects, wired as build_app wires them."""
    with Store(":memory:") as store:
        seed_pairs(store, 3)
        config = AppConfig()
        job = GenerationJob(FakeGenerator(store))
        runner = idle_runner(store)
        yield SimpleNamespace(store=store, config=config, job=job, runner=runner,
                              annotate=AnnotateHandlers(store, config, job, runner),
                              admin=AdminHandlers(store, config, job, runner))


def signed_in(parts, name):
    session, view, message = parts.annotate.sign_in(name, Session())
    assert message == "" and view.signed_in
    return session, view


def test_vote_records_the_choice_about_gen_a_gen_b_with_side_and_seconds_then_shows_the_next_pair(app_parts):
    session, view = signed_in(app_parts, "alice")
    shown = session.showing
    assert view.pair_id == shown.pair_id == 1
    assert "Prompt 1" in view.prompt_html
    assert ("first answer 1" in view.left_html) == shown.a_on_left  # gen_a is on the side the store drew
    session, view = app_parts.annotate.vote("left", 1, "", session)
    [vote] = app_parts.store.votes(annotator="alice")
    assert (vote.pair_id, vote.choice, vote.a_on_left) == (1, "a" if shown.a_on_left else "b", shown.a_on_left)
    assert 0 <= vote.seconds < 5
    assert view.recorded and view.pair_id == 2 and "Recorded: A slightly better." in view.status
    assert vote.strength == 1
    assert "your votes: 1" in view.progress and "pairs left: 2" in view.progress


def test_the_graded_buttons_store_side_and_strength_and_the_others_none(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, view = app_parts.annotate.vote("left_much", 1, "", session)
    assert "Recorded: A much better." in view.status
    session, _ = app_parts.annotate.vote("right_much", 2, "", session)
    session, _ = app_parts.annotate.vote("right", 3, "", session)
    votes = app_parts.store.votes(annotator="alice")
    assert [(v.pair_id, v.strength) for v in votes] == [(1, 2), (2, 2), (3, 1)]
    # the side is the one the screen showed: left is gen_a when gen_a was drawn to the left
    assert [v.choice == "a" for v in votes] == [votes[0].a_on_left, not votes[1].a_on_left, not votes[2].a_on_left]


def test_right_tie_and_both_bad_are_stored_as_such(app_parts):
    session, _ = signed_in(app_parts, "alice")
    a_on_left = session.showing.a_on_left
    session, _ = app_parts.annotate.vote("right", 1, "", session)
    session, _ = app_parts.annotate.vote("tie", 2, "", session)
    session, _ = app_parts.annotate.vote("both_bad", 3, "", session)
    assert [(v.pair_id, v.choice) for v in app_parts.store.votes(annotator="alice")] == [
        (1, "b" if a_on_left else "a"), (2, "tie"), (3, "both_bad")]
    assert [v.strength for v in app_parts.store.votes(annotator="alice")] == [1, None, None]


def test_skip_is_recorded_and_the_skipped_pair_does_not_come_back(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, view = app_parts.annotate.vote("skip", 1, "", session)
    assert [(v.pair_id, v.choice) for v in app_parts.store.votes(annotator="alice")] == [(1, "skip")]
    assert view.pair_id == 2 and "Recorded: Skip." in view.status
    session, view, _ = app_parts.annotate.sign_in("alice", Session())  # even after signing in again
    assert view.pair_id == 2


def test_double_submit_records_one_vote_and_never_votes_on_the_next_pair(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, first = app_parts.annotate.vote("left", 1, "", session)
    session, second = app_parts.annotate.vote("left", 1, "", session)  # the same click arriving twice
    assert [v.pair_id for v in app_parts.store.votes(annotator="alice")] == [1]
    assert second.pair_id == first.pair_id == 2
    assert not second.recorded and "already recorded" in second.status


def test_a_vote_naming_a_pair_that_is_not_on_screen_records_nothing(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, view = app_parts.annotate.vote("left", 3, "", session)
    assert app_parts.store.votes() == [] and view.pair_id == 1


def test_unknown_choice_and_no_sign_in_record_nothing(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, view = app_parts.annotate.vote("middle", 1, "", session)
    assert "Unknown choice" in view.status
    _, view = app_parts.annotate.vote("left", 1, "", Session())
    assert not view.signed_in and view.status == "Sign in first."
    assert app_parts.store.votes() == []


def test_empty_queue_says_so_and_pairs_appear_once_generated(app_parts):
    session, _ = signed_in(app_parts, "alice")
    for pair_id in (1, 2, 3):
        session, view = app_parts.annotate.vote("tie", pair_id, "", session)
    assert view.pair_id is None and view.waiting
    assert "No pairs are waiting for you right now." in view.status and "An admin can generate more" in view.status
    app_parts.store.add_prompts(["A new prompt"])
    app_parts.job.start(1, 0.0, "test")
    app_parts.job.wait(5)
    session, view = app_parts.annotate.look_for_pair(session)
    assert view.pair_id == 4 and "A new prompt" in view.prompt_html


def test_better_answer_is_stored_as_a_demonstration_with_the_vote(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session, view = app_parts.annotate.vote("both_bad", 1, "  Hello there!  ", session)
    assert app_parts.store.demonstrations() == [("Prompt 1", "Hello there!")]
    assert "Your better answer was saved." in view.status


def test_an_admin_sees_the_pair_id_to_mark_gold_and_an_annotator_does_not(app_parts):
    admin_session, admin_view = signed_in(app_parts, "alice")  # the first to sign in: an admin
    _, annotator_view = signed_in(app_parts, "bob")
    assert admin_view.progress.endswith(f" · pair {admin_session.showing.pair_id}")
    assert annotator_view.pair_id is not None and "pair " not in annotator_view.progress.replace("pairs left", "")


def test_first_person_to_sign_in_becomes_admin_and_is_told(app_parts):
    _, view = signed_in(app_parts, "alice")
    assert "first person to sign in" in view.status and "admin" in view.status
    signed_in(app_parts, "bob")
    assert {a.name: a.role for a in app_parts.store.annotators()} == {"alice": "admin", "bob": "annotator"}


def test_admins_named_at_start_stop_the_first_sign_in_rule():
    with Store(":memory:") as store:
        seed_pairs(store, 1)
        build_app(store, GenerationJob(FakeGenerator(store)), idle_runner(store), AppConfig(admins=("carol",)))
        handlers = AnnotateHandlers(store, AppConfig(admins=("carol",)), GenerationJob(FakeGenerator(store)),
                                    idle_runner(store))
        handlers.sign_in("alice", Session())
        assert {a.name: a.role for a in store.annotators()} == {"carol": "admin", "alice": "annotator"}


def test_sign_in_cleans_names_and_refuses_empty_ones(app_parts):
    session, view, message = app_parts.annotate.sign_in("   ", Session())
    assert message == "Type your name to sign in." and not view.signed_in and session.name is None
    session, _, _ = app_parts.annotate.sign_in("  Ada   Lovelace ", Session())
    assert session.name == "ada lovelace"  # stored normalised: one person, one name (annotate.identity)
    session, view, message = app_parts.annotate.sign_in("ali\u200bce", Session())
    assert message == "Names cannot hold invisible or control characters (found U+200B ZERO WIDTH SPACE)."
    assert not view.signed_in and session.name is None


def test_with_an_auth_file_the_name_comes_from_the_login_not_the_form(app_parts):
    config = AppConfig(require_auth=True)
    handlers = AnnotateHandlers(app_parts.store, config, app_parts.job, app_parts.runner)
    session, view, _ = handlers.sign_in("mallory", Session(), SimpleNamespace(username="alice"))
    assert session.name == "alice" and view.signed_in
    session, view = handlers.vote("left", 1, "", Session(name="alice", showing=session.showing),
                                  SimpleNamespace(username=None))
    assert not view.signed_in and app_parts.store.votes() == []


def test_admin_handlers_refuse_an_annotator_and_change_nothing(app_parts, tmp_path):
    signed_in(app_parts, "alice")  # the first: admin
    bob, _ = signed_in(app_parts, "bob")
    prompts_file = tmp_path / "p.txt"
    prompts_file.write_text("one more\n")
    refusal = "Only admins can do this: bob is an annotator."
    assert app_parts.admin.start_round(bob).startswith(refusal)
    assert app_parts.admin.import_prompts(str(prompts_file), bob).startswith(refusal)
    assert app_parts.admin.generate_pairs(2, 0.0, bob)[1].startswith(refusal)
    assert app_parts.admin.set_auto_every(5, bob).startswith(refusal)
    assert app_parts.admin.export("jsonl", bob)[0] is None
    message, frame = app_parts.admin.set_role("bob", "admin", bob)
    assert message.startswith(refusal) and frame.empty
    assert app_parts.store.role_of("bob") == "annotator" and app_parts.store.count_prompts() == 3
    assert app_parts.job.progress().total == 0 and not app_parts.runner.running()
    assert app_parts.admin.start_round(Session()) == "Sign in first (Annotate tab)."


def test_admin_is_checked_at_call_time_so_a_demoted_admin_is_refused(app_parts):
    alice, _ = signed_in(app_parts, "alice")
    signed_in(app_parts, "bob")
    assert app_parts.admin.set_role("bob", "admin", alice)[0] == "bob is now admin."
    bob = Session(name="bob")
    assert app_parts.admin.set_role("alice", "annotator", bob)[0] == "alice is now annotator."
    assert app_parts.admin.export("jsonl", alice)[0] is None  # alice's session still exists but she is no admin


def test_the_only_admin_cannot_demote_themselves(app_parts):
    alice, _ = signed_in(app_parts, "alice")
    message, _ = app_parts.admin.set_role("alice", "annotator", alice)
    assert message == "You are the only admin: make someone else admin first."
    assert app_parts.store.is_admin("alice")


def test_admin_imports_prompts_and_sees_importer_errors(app_parts, tmp_path):
    alice, _ = signed_in(app_parts, "alice")
    good = tmp_path / "more.jsonl"
    good.write_text('{"prompt": "Prompt 1"}\n{"prompt": "Brand new"}\n')
    assert app_parts.admin.import_prompts(str(good), alice) == (
        "Imported 1 new prompts from more.jsonl (1 already there); 4 prompts in all.")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{not json\n')
    message = app_parts.admin.import_prompts(str(bad), alice)
    assert message.startswith("Nothing imported: bad.jsonl, line 2: malformed JSON") and str(tmp_path) not in message
    assert app_parts.store.count_prompts() == 4


def test_admin_generates_pairs_with_a_progress_bar(app_parts):
    alice, _ = signed_in(app_parts, "alice")
    app_parts.store.add_prompts(["p4", "p5"])
    app_parts.job.generator.seconds_per_pair = 0.05
    assert app_parts.admin.generate_pairs(2, 0.25, alice) == (True, "Generating 2 pairs (versus share 25%).")
    updates = list(app_parts.admin.generation_progress(poll_s=0.01))
    assert len(updates) > 2 and all(update.startswith('<progress value="') for update in updates[:-1])
    assert '<progress value="1" max="2"' in "".join(updates)
    assert updates[-1].startswith("<div>Generated 2 pairs")
    assert app_parts.job.generator.calls == [(2, 0.25)] and app_parts.store.count_pairs() == 5
    assert app_parts.admin.generate_pairs(0, 0.0, alice) == (False, "Ask for between 1 and 10000 pairs, not 0.")


def test_admin_exports_preferences_as_jsonl(app_parts):
    alice, _ = signed_in(app_parts, "alice")
    session = alice
    session, _ = app_parts.annotate.vote("left", 1, "", session)
    path, message = app_parts.admin.export("jsonl", alice)
    text = open(path, encoding="utf-8").read()
    chosen = "first answer 1" if alice.showing.a_on_left else "second answer 1"
    assert message.startswith("1 preferences") and f'"chosen": "{chosen}"' in text
    assert app_parts.admin.export("csv", alice) == (None, "Export format must be one of jsonl, parquet.")


def script(tmp_path, source: str) -> list[str]:
    """A command running `source` with this Python (a stand-in for `app.py --train-round`)."""
    path = tmp_path / "fake_round.py"
    path.write_text(source)
    return [sys.executable, str(path)]


def test_round_runner_streams_the_log_and_runs_one_round_at_a_time(app_parts, tmp_path):
    steps = "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.05)\ntime.sleep(0.5)\n"
    runner = RoundRunner(app_parts.store, script(tmp_path, steps))
    assert runner.start("alice") [0]
    started, message = runner.start("bob")
    assert not started and message.startswith("A round is already running (started by alice")
    assert runner.wait(10) == 0
    lines = runner.log_text().splitlines()
    assert lines[1:4] == ["step 0", "step 1", "step 2"] and lines[4].startswith("[round process exited with code 0")


def test_round_runner_refuses_while_the_store_has_a_running_round(app_parts, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        app_parts.store.start_round(pid=sleeper.pid)
        runner = RoundRunner(app_parts.store, script(tmp_path, "print('round')\n"))
        started, message = runner.start("alice")
        assert not started and message.startswith(f"Round 1 is already running (process {sleeper.pid}")
    finally:
        sleeper.kill()
        sleeper.wait()
    # once that process is gone its round is stale: marked failed, and a new round may start
    assert runner.start("alice")[0] and runner.wait(10) == 0
    assert app_parts.store.round(1).status == "failed"


def test_round_log_keeps_one_line_per_progress_bar(app_parts, tmp_path):
    # tqdm redraws with carriage returns: three redraws of one bar become one line, the last
    bars = ("import sys\nfor i in (0, 50, 100):\n    sys.stdout.write(f'\\rreward model:  {i}%|##| {i}/100')\n"
            "print()\nprint('done')\n")
    runner = RoundRunner(app_parts.store, script(tmp_path, bars))
    runner.start("alice")
    runner.wait(10)
    assert runner.log_text().splitlines()[1:3] == ["reward model:  100%|##| 100/100", "done"]


def test_auto_start_after_every_n_new_votes(app_parts):
    runner = RoundRunner(app_parts.store, [sys.executable, "-c", "print('round')"], auto_every=2)
    handlers = AnnotateHandlers(app_parts.store, app_parts.config, app_parts.job, runner)
    session, _, _ = handlers.sign_in("alice", Session())
    session, view = handlers.vote("left", 1, "", session)
    assert not runner.running() and runner.exit_code() is None and runner.new_votes() == 1
    session, view = handlers.vote("skip", 2, "", session)  # skips are not new training data
    assert runner.exit_code() is None
    session, view = handlers.vote("right", 3, "", session)
    assert "A training round started automatically." in view.status
    assert runner.wait(10) == 0 and "round" in runner.log_text() and runner.new_votes() == 0


def test_first_start_generates_a_batch_in_the_background():
    with Store(":memory:") as store:
        store.add_prompts(["a", "b", "c"])
        generator = FakeGenerator(store)
        build_app(store, GenerationJob(generator), idle_runner(store), AppConfig(first_batch_pairs=2))
        deadline = time.monotonic() + 10
        while store.count_pairs() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert generator.calls == [(2, 0.0)] and store.count_pairs() == 2


def test_first_start_waiting_page_says_what_the_pair_maker_does_then_shows_the_first_pair():
    import threading

    with Store(":memory:") as store:
        store.add_prompts(["a", "b"])
        loaded = threading.Event()

        class LoadingGenerator(FakeGenerator):
            def generate(self, n_pairs, versus_share, progress):
                progress.stage("loading the model")
                loaded.wait(10)
                return super().generate(n_pairs, versus_share, progress)

        job = GenerationJob(LoadingGenerator(store))
        job.start(2, 0.0, started_by="first start")
        handlers = AnnotateHandlers(store, AppConfig(), job, idle_runner(store))
        session, _, _ = handlers.sign_in("alice", Session())

        def look(until, seconds=10):
            deadline = time.monotonic() + seconds
            while True:
                state, view = handlers.look_for_pair(session)
                if until(view) or time.monotonic() > deadline:
                    return state, view
                time.sleep(0.01)

        _, view = look(lambda view: "loading the model" in view.status)
        assert view.pair_id is None and "Preparing 2 pairs: loading the model" in view.status
        loaded.set()
        _, view = look(lambda view: view.pair_id is not None)
        assert view.pair_id is not None
        job.wait(10)


def test_untrusted_text_renders_markdown_but_html_stays_text():
    html = render_untrusted("**bold** <script>alert(1)</script> <img src=x onerror=alert(2)> "
                            "[x](javascript:alert(3)) ![pic](http://example.com/p.png)\n\n```\nif a < b: pass\n```")
    assert "<strong>bold</strong>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html and "<img" not in html
    assert 'href="javascript' not in html  # markdown-it refuses the link; the text stays
    assert "<code>if a &lt; b: pass\n</code>" in html
    assert escape("<b>*x*</b>") == "&#60;b&#62;&#42;x&#42;&#60;/b&#62;"


def test_wilson_interval_by_hand():
    # p = 0.5, n = 100, z = 1.959964: z^2 = 3.841459, z^2/n = 0.0384146, denominator = 1.0384146
    # center = (0.5 + 0.0192073) / 1.0384146 = 0.5
    # half = 1.959964 / 1.0384146 * sqrt(0.25/100 + 3.841459/40000) = 1.887459 * sqrt(0.0025960) = 0.0961689
    low, high = wilson_interval(0.5, 100)
    assert low == pytest.approx(0.5 - 0.0961689, abs=1e-6) and high == pytest.approx(0.5 + 0.0961689, abs=1e-6)
    # p = 1, n = 10: the square root is z / (2n), so center - half = (1 + z^2/2n - z^2/2n) / denominator
    # = 1 / (1 + 3.841459 / 10) = 1 / 1.3841459 = 0.7224672, and the upper end is 1
    low, high = wilson_interval(1.0, 10)
    assert low == pytest.approx(0.7224672, abs=1e-6) and high == pytest.approx(1.0)


def test_dashboard_counts_agreement_and_win_rates(app_parts):
    store = app_parts.store
    for name, choice in (("alice", "a"), ("bob", "a"), ("carol", "b")):
        store.record_vote(1, name, choice, True, 1.0)
    newer = store.add_policy(1, "round-1")
    store.add_pairs_bulk([NewPair(1, NewGeneration(newer, "new", 1, "eos"), NewGeneration(1, "old", 1, "eos"), kind="versus")])
    store.record_vote(4, "alice", "a", False, 1.0)
    view = DashboardHandlers(store, app_parts.config).refresh()
    counts, by_annotator, agreement_text, agreement, win_rates = (
        view.counts, view.by_annotator, view.agreement_text, view.agreement, view.win_rates)
    assert "**votes** 4" in counts and "a: 3 · b: 1" in counts
    assert by_annotator.values.tolist() == [["alice", 2], ["bob", 1], ["carol", 1]]
    # pair 1: alice a, bob a, carol b -> rating pairs (alice,bob) agree, (alice,carol) and (bob,carol) do not: 1/3
    assert "over 1 pairs" in agreement_text and "**33%**" in agreement_text
    assert agreement.values.tolist()[0][:4] == ["alice", "bob", 1, "100%"]
    low, _high = wilson_interval(1.0, 1)  # one vote for the newer policy
    assert win_rates.values.tolist() == [["round 1 (policy 2)", "round 0 (policy 1)", 1, 0, 0, 0,
                                          f"100% ({low:.0%}-100%)"]]
