"""What people meet on the page, through the handlers (the browser side: tests/test_browser_screens.py): a second tab
told that its person's earlier vote stands, parallel submits of one vote, the Admin tab shown to admins only, long
prompts folded, tables and code rendered, import errors naming the uploaded file, empty charts, and the votes counted
since the last finished round."""

import sys
import threading
from dataclasses import replace

import gradio as gr

from annotate.importers import ACCEPTED_FORMATS
from annotate.records import NewGeneration, NewPair
from loop.children.pair_job import GenerationJob
from loop.children.round_runner import RoundRunner
from annotate.store import Store
from annotate.ui import build_app
from annotate.ui_session import AppConfig, Session, render_untrusted
from annotate.ui_style import render_prompt
from test_ui import FakeGenerator, app_parts, idle_runner, seed_pairs, signed_in  # noqa: F401 (app_parts: fixture)


def on_screen(session: Session, a_on_left: bool) -> Session:
    """The session with gen_a drawn to the given side."""
    return replace(session, showing=replace(session.showing, a_on_left=a_on_left))


def test_a_second_tab_voting_otherwise_on_the_same_pair_is_told_the_earlier_vote_stands(app_parts):
    first_tab, _ = signed_in(app_parts, "alice")
    second_tab, _ = signed_in(app_parts, "alice")  # the same person in another tab is shown the same pair
    first_tab, second_tab = on_screen(first_tab, a_on_left=True), on_screen(second_tab, a_on_left=False)
    _, first = app_parts.annotate.vote("left", 1, "", first_tab)
    second_tab, second = app_parts.annotate.vote("left", 1, "A better one.", second_tab)
    assert first.status == "Recorded: A slightly better."
    # gen_a won in the first tab; the second tab shows gen_a on the right, so the vote that stands is "B slightly
    # better"
    assert second.status == ("Your earlier vote (B slightly better) stands; this one was not recorded (nor its "
                             "better answer).")
    assert not second.recorded and second.earlier_vote_stands and second.pair_id == 2
    assert [(v.pair_id, v.annotator, v.choice) for v in app_parts.store.votes()] == [(1, "alice", "a")]
    assert app_parts.store.demonstrations() == []


def test_ten_parallel_votes_from_one_session_store_one_vote_and_one_better_answer(app_parts):
    session, _ = signed_in(app_parts, "alice")
    session = on_screen(session, a_on_left=True)
    barrier = threading.Barrier(10)
    statuses = []

    def click():
        barrier.wait()
        statuses.append(app_parts.annotate.vote("left", 1, "Hi! How can I help?", session)[1].status)

    threads = [threading.Thread(target=click) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == ["Recorded: A slightly better. Your better answer was saved."] + [
        "Your earlier vote (A slightly better) stands; this one was not recorded (nor its better answer)."] * 9
    assert [(v.pair_id, v.choice) for v in app_parts.store.votes()] == [(1, "a")]
    assert app_parts.store.demonstrations() == [("Prompt 1", "Hi! How can I help?")]


def test_the_admin_tab_is_shown_to_admins_only_and_its_handlers_still_refuse_annotators(app_parts):
    alice, _ = signed_in(app_parts, "alice")  # the first to sign in: admin
    bob, _ = signed_in(app_parts, "bob")
    assert [app_parts.admin.tab_visible(s) for s in (alice, bob, Session())] == [True, False, False]
    assert app_parts.admin.start_round(bob).startswith("Only admins can do this: bob is an annotator.")
    demo = build_app(app_parts.store, GenerationJob(FakeGenerator(app_parts.store)), idle_runner(app_parts.store),
                     AppConfig())
    [admin_tab] = [block for block in demo.blocks.values() if isinstance(block, gr.Tab) and block.id == "admin"]
    assert admin_tab.visible is False  # until sign-in says the person is an admin


def test_a_very_long_prompt_is_folded_behind_show_all_and_stays_text():
    prompt = "<script>window.x = 1</script> Summarise: " + "word " * 20_000
    folded = render_prompt(prompt)
    assert folded.startswith('<details class="long-prompt"><summary><span class="show-all">Show all (100,041 '
                             'characters)</span><span class="show-less">Show less</span><div class="prompt-preview">'
                             "&lt;script&gt;window.x = 1&lt;/script&gt; Summarise: word word")
    assert "<script" not in folded and folded.endswith("</div></details>")
    assert render_prompt("Say hi.") == render_untrusted("Say hi.")


def test_a_pair_with_a_long_prompt_shows_it_folded(app_parts):
    app_parts.store.add_prompts(["Q " * 5000])
    policy = app_parts.store.latest_policy().id
    app_parts.store.add_pairs_bulk([NewPair(4, NewGeneration(policy, "x", 1, "eos"), NewGeneration(policy, "y", 1, "eos"))])
    session, _ = signed_in(app_parts, "alice")
    for pair_id in (1, 2, 3):
        session, view = app_parts.annotate.vote("skip", pair_id, "", session)
    assert view.pair_id == 4 and view.prompt_html.startswith('<details class="long-prompt">')


def test_tables_and_code_blocks_render_and_html_inside_them_stays_text():
    html = render_untrusted("| name | score |\n|---|---|\n| <img src=x onerror=alert(1)> | `9` |\n\n```\nx = 1\n```")
    assert "<table>\n<thead>\n<tr>\n<th>name</th>\n<th>score</th>" in html
    assert "<td>&lt;img src=x onerror=alert(1)&gt;</td>\n<td><code>9</code></td>" in html and "<img" not in html
    assert "<pre><code>x = 1\n</code></pre>" in html


def test_import_errors_name_the_file_as_uploaded_and_say_what_is_accepted(app_parts, tmp_path):
    alice, _ = signed_in(app_parts, "alice")
    upload = tmp_path / "gradio" / "3f9c0a" / "setup.exe"  # where Gradio keeps an upload: its name, our folder
    upload.parent.mkdir(parents=True)
    upload.write_bytes(b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff")
    assert app_parts.admin.import_prompts(str(upload), alice) == (
        f"Nothing imported: setup.exe: unsupported file type &#39;.exe&#39;; accepted: {ACCEPTED_FORMATS}")  # markdown
    latin = upload.with_name("prompts.txt")
    latin.write_bytes("caf\u00e9\n".encode("latin-1"))
    message = app_parts.admin.import_prompts(str(latin), alice)
    assert message.startswith("Nothing imported: prompts.txt, line 1: not UTF-8 text (unexpected end of data at "
                              "byte 3); save it as UTF-8 text, or use one of: JSON Lines (.jsonl)")
    assert str(tmp_path) not in message and app_parts.store.count_prompts() == 3


def test_the_admin_tab_counts_votes_since_the_last_finished_round_after_a_refused_one(tmp_path):
    with Store(":memory:") as store:
        seed_pairs(store, 3)
        done = store.start_round(pid=1)
        store.finish_round(done, {})
        store.record_vote(1, "alice", "a", True)
        store.record_vote(2, "alice", "b", True)
        store.record_vote(3, "alice", "skip", True)  # skips are no training data
        refused = tmp_path / "refused_round.py"
        refused.write_text("import sys\nprint('round refused: too few pairs', file=sys.stderr)\nsys.exit(3)\n")
        runner = RoundRunner(store, [sys.executable, str(refused)], auto_every=5)
        assert runner.start("alice")[0] and runner.wait(10) == 3
        store.fail_round(store.start_round(pid=1), "RoundRefused: too few pairs")  # what the refused round records
        assert runner.status_text() == (
            "No round running. Last round from here exited with code 3. 2 new votes since the last finished round "
            "(round 1); auto-start every 5 new votes (the next after 5 more).")
