"""Limits on size and on characters: an over-long prompt or one holding control characters is refused at import (the
command, the store, the Admin tab) naming its file and line, and nothing is imported; an over-long better answer or
one holding control characters is refused by the store and by the annotate page, which keeps what was typed."""

import html
import json
import unicodedata

import pytest

import app
from annotate.importers import PromptImportError, read_prompts
from annotate.store import Store
from annotate.text_limits import MAX_ANSWER_CHARS, MAX_PROMPT_CHARS, control_characters
from annotate.ui import build_app
from annotate.ui_annotate import AnnotateHandlers
from annotate.ui_session import AppConfig, Session
from loop.children.pair_job import GenerationJob
from loop.config import AppSettings
from test_ui import FakeGenerator, app_parts, idle_runner, seed_pairs, signed_in  # noqa: F401 (app_parts: fixture)

LONG = "x" * 300_000
"""A long prompt, kept to a few hundred KB so the tests stay fast (the probe's was 50 MB)."""
SMALL_LIMIT = 1000
TOO_LONG = (f"the prompt is 300,000 characters; the longest accepted is 1,000 ([app] max_prompt_chars): shorten it or "
            f"raise the limit")


def long_prompt_file(tmp_path, suffix: str):
    """A file whose third line holds the long prompt, after two short ones."""
    path = tmp_path / f"prompts{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in ("one", "two", LONG)))
    elif suffix == ".csv":
        path.write_text(f"prompt\none\n{LONG}\n")  # the header is line 1: the long prompt is on line 3
    else:
        path.write_text(f"one\ntwo\n{LONG}\n")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".txt"])
def test_an_over_long_prompt_is_refused_naming_the_file_and_line_and_nothing_is_imported(tmp_path, suffix):
    path = long_prompt_file(tmp_path, suffix)
    with Store(":memory:") as store:
        with pytest.raises(PromptImportError) as refused:
            store.import_prompts(path, max_prompt_chars=SMALL_LIMIT)
        assert str(refused.value) == f"{path}, line 3: {TOO_LONG}"
        assert refused.value.naming(path.name) == f"prompts{suffix}, line 3: {TOO_LONG}"
        assert store.count_prompts() == 0


def test_a_json_list_or_a_parquet_file_names_the_item_or_row(tmp_path):
    import datasets

    listed = tmp_path / "prompts.json"
    listed.write_text(json.dumps(["one", LONG]))
    with pytest.raises(PromptImportError, match=r"prompts\.json: item 2: the prompt is 300,000 characters"):
        read_prompts(listed, max_prompt_chars=SMALL_LIMIT)
    table = tmp_path / "prompts.parquet"
    datasets.Dataset.from_dict({"prompt": ["one", LONG]}).to_parquet(str(table))
    with pytest.raises(PromptImportError, match=r"prompts\.parquet: row 2: the prompt is 300,000 characters"):
        read_prompts(table, max_prompt_chars=SMALL_LIMIT)


def test_the_default_limit_refuses_a_prompt_of_20000_characters_and_takes_one_of_16000(tmp_path):
    assert AppSettings().max_prompt_chars == MAX_PROMPT_CHARS == 16000
    assert AppSettings().max_answer_chars == MAX_ANSWER_CHARS == 8000
    path = tmp_path / "p.txt"
    path.write_text("a" * 20_000 + "\n")
    with Store(":memory:") as store:
        with pytest.raises(PromptImportError, match=r"p\.txt, line 1: the prompt is 20,000 characters; the longest "
                                                    r"accepted is 16,000 \(\[app\] max_prompt_chars\)"):
            store.import_prompts(path)
        path.write_text("a" * 16_000 + "\n")
        assert store.import_prompts(path).added == 1


def test_the_limit_is_a_setting_a_larger_one_imports_the_long_prompt(tmp_path):
    with Store(":memory:") as store:
        assert store.import_prompts(long_prompt_file(tmp_path, ".jsonl"), max_prompt_chars=400_000).added == 3
        assert max(len(prompt.text) for prompt in store.prompts()) == 300_000


@pytest.mark.parametrize("name", ["nul.txt", "nul"])
def test_a_file_of_nul_bytes_is_refused_with_a_sentence(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\x00" * 4096)
    with Store(":memory:") as store:
        with pytest.raises(PromptImportError) as refused:
            store.import_prompts(path)
        assert refused.value.naming(name) == (f"{name}, line 1: the prompt holds control characters (NUL at "
                                              f"character 1); prompts are text: remove them")
        assert store.count_prompts() == 0


def test_control_characters_inside_a_prompt_are_refused_with_where_they_are(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": "ok \x1b[31mred\x07 \x00"}) + "\n")
    with pytest.raises(PromptImportError) as refused:
        read_prompts(path)
    assert refused.value.naming("p.jsonl") == ("p.jsonl, line 2: the prompt holds control characters (ESC at "
                                               "character 4, BEL at character 12, NUL at character 14); prompts are "
                                               "text: remove them")
    with Store(":memory:") as store, pytest.raises(ValueError, match=r"prompt 2 of 2: the prompt holds control"):
        store.add_prompts(["fine", "a\x7fb"])  # the store refuses them however they come


def test_tabs_and_line_breaks_are_still_fine(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "Columns:\ta\tb\r\nand a second line"}) + "\n")
    text = tmp_path / "p.txt"
    text.write_bytes(b"one\ttab\r\ntwo\n")
    csv = tmp_path / "p.csv"
    csv.write_text('prompt\n"two\nlines"\n')
    assert read_prompts(jsonl) == ["Columns:\ta\tb\r\nand a second line"]
    assert read_prompts(text) == ["one\ttab", "two"]
    assert read_prompts(csv) == ["two\nlines"]
    assert control_characters("a\tb\nc\rd\u200b") == {}  # a zero-width space is not a control character
    assert control_characters("\x00a\x00\x85", allowed="") == {"\x00": 1, "\x85": 4}
    every = "".join(map(chr, range(0xD800)))  # the control characters found are exactly Unicode's (category Cc)
    assert set(control_characters(every, allowed="")) == {c for c in every if unicodedata.category(c) == "Cc"}


def test_the_store_refuses_an_over_long_or_control_character_demonstration():
    with Store(":memory:") as store:
        seed_pairs(store, 1)
        with pytest.raises(ValueError, match="Your better answer is 8,001 characters; the longest accepted is 8,000: "
                                             "please shorten it."):
            store.add_demonstration(1, "alice", "a" * 8001)
        with pytest.raises(ValueError, match="is 101 characters; the longest accepted is 100"):
            store.add_demonstration(1, "alice", "a" * 101, pair_id=1, max_answer_chars=100)
        with pytest.raises(ValueError, match=r"Your better answer holds control characters \(NUL at character 6\): "
                                             r"please remove them\."):
            store.add_demonstration(1, "alice", "Hello\x00")
        with pytest.raises(ValueError, match="is 101 characters"):
            store.submit_vote(1, "alice", "a", a_on_left=True, better_answer="a" * 101, max_answer_chars=100)
        assert store.demonstrations() == [] and store.votes() == []  # the vote did not land without its answer
        assert store.add_demonstration(1, "alice", "Line one\n\tindented", max_answer_chars=100) is not None


def test_the_better_answer_box_refuses_an_over_long_answer_and_keeps_the_text(app_parts):
    session, view = signed_in(app_parts, "alice")
    typed = "b" * (MAX_ANSWER_CHARS + 1)
    session, view = app_parts.annotate.vote("left", view.pair_id, typed, session)
    assert view.status == ("Your better answer is 8,001 characters; the longest accepted is 8,000: please shorten "
                           "it. Nothing was recorded yet; your answer is still in the box.")
    assert view.pair_id == 1 and not view.recorded and not view.earlier_vote_stands  # the box keeps it
    assert app_parts.store.votes() == [] and app_parts.store.demonstrations() == []
    session, view = app_parts.annotate.vote("left", 1, "Hi\x00", session)
    assert view.status.startswith("Your better answer holds control characters (NUL at character 3)")
    session, view = app_parts.annotate.vote("left", 1, "b" * 100, session)  # shortened: it goes through
    assert view.recorded and "Your better answer was saved." in view.status


def test_the_page_keeps_the_refused_answer_in_the_box_and_the_limit_comes_from_the_config():
    config = AppConfig(max_answer_chars=50)
    with Store(":memory:") as store:
        seed_pairs(store, 2)
        job, runner = GenerationJob(FakeGenerator(store)), idle_runner(store)
        demo = build_app(store, job, runner, config)
        session, _, _ = AnnotateHandlers(store, config, job, runner).sign_in("alice", Session())
        [vote] = [f.fn for f in demo.fns.values() if f.api_name == "vote"]
        shown = {getattr(component, "elem_id", None): value
                 for component, value in vote("left", 1, "c" * 51, session, None).items()}
        assert shown["better-answer"] == "c" * 51
        assert shown["status"].startswith("Your better answer is 51 characters; the longest accepted is 50")
        assert store.votes() == []


def test_the_admin_tab_refuses_an_over_long_prompt_with_the_configured_limit(app_parts, tmp_path):
    alice, _ = signed_in(app_parts, "alice")
    upload = long_prompt_file(tmp_path, ".jsonl")
    message = app_parts.admin.import_prompts(str(upload), alice)  # the default limit: 16,000
    assert html.unescape(message) == ("Nothing imported: prompts.jsonl, line 3: the prompt is 300,000 characters; "
                                      "the longest accepted is 16,000 ([app] max_prompt_chars): shorten it or raise "
                                      "the limit")
    assert app_parts.store.count_prompts() == 3
    app_parts.admin.config.max_prompt_chars = 400_000
    assert app_parts.admin.import_prompts(str(upload), alice).startswith("Imported 3 new prompts")


def test_the_import_command_exits_2_with_the_message_and_takes_a_larger_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no rlhf-loop.toml of the working tree is read
    db, path = tmp_path / "x.db", long_prompt_file(tmp_path, ".txt")
    assert app.main(["--import-prompts", str(path), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert (f"{path}, line 3: the prompt is 300,000 characters; the longest accepted is 16,000 ([app] "
            f"max_prompt_chars): shorten it or raise the limit (nothing was imported)") in err
    with Store(db) as store:
        assert store.count_prompts() == 0
    assert app.main(["--import-prompts", str(path), "--db", str(db), "--set", "app.max_prompt_chars=400000"]) == 0
    with Store(db) as store:
        assert store.count_prompts() == 3
