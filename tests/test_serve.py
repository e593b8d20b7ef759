"""`python app.py` (serve): refusing unsafe exposure, auth files, seeding an empty database, the round command."""

import json

import pytest

import app
from annotate.serve import (
    ServeError, check_exposure, is_local_host, password_checker, read_auth_file, round_command, seed_prompts,
)
from annotate.store import Store


def test_local_hosts():
    assert all(is_local_host(h) for h in ("127.0.0.1", "127.0.1.1", "localhost", "::1"))
    assert not any(is_local_host(h) for h in ("0.0.0.0", "192.168.1.5", "example.com", "::"))


def test_share_or_a_public_host_without_auth_is_refused_with_the_fix():
    with pytest.raises(ServeError, match=r"--share .* --auth FILE"):
        check_exposure("127.0.0.1", True, None)
    with pytest.raises(ServeError, match=r"--host 0\.0\.0\.0 lets other machines .* --auth FILE"):
        check_exposure("0.0.0.0", False, None)
    check_exposure("0.0.0.0", True, "people.txt")
    check_exposure("127.0.0.1", False, None)


@pytest.mark.parametrize("argv", [["--share"], ["--host", "0.0.0.0"], ["--host", "10.0.0.2", "--port", "8000"]])
def test_app_exits_2_with_an_explanation_before_opening_anything(argv, capsys, tmp_path):
    assert app.main([*argv, "--db", str(tmp_path / "x.db")]) == 2
    assert "--auth FILE" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()


def test_auth_file_lines_comments_and_errors_with_line_numbers(tmp_path):
    good = tmp_path / "people.txt"
    good.write_text("# team\nalice:s3cret:with:colons\n\n  bob : pw \n")
    assert read_auth_file(good) == {"alice": "s3cret:with:colons", "bob": " pw "}
    bad = tmp_path / "bad.txt"
    bad.write_text("alice:pw\ncarol\n")
    with pytest.raises(ServeError, match=r"bad\.txt, line 2: expected name:password"):
        read_auth_file(bad)
    bad.write_text("alice:pw\nalice:other\n")
    with pytest.raises(ServeError, match="line 2: alice appears twice"):
        read_auth_file(bad)
    bad.write_text("# nobody\n")
    with pytest.raises(ServeError, match="holds no name:password line"):
        read_auth_file(bad)
    with pytest.raises(ServeError, match="cannot read the auth file"):
        read_auth_file(tmp_path / "missing.txt")


def test_password_checker():
    check = password_checker({"alice": "pw"})
    assert check("alice", "pw") and check(" alice ", "pw")
    assert not check("alice", "PW") and not check("bob", "pw") and not check("bob", "\0") and not check("", "")


def test_seed_prompts_only_on_an_empty_database(tmp_path):
    shipped = tmp_path / "prompts.jsonl"
    shipped.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    with Store(":memory:") as store:
        assert seed_prompts(store, shipped) == f"Imported 2 prompts from {shipped}."
        assert seed_prompts(store, shipped) == "" and store.count_prompts() == 2
    with Store(":memory:") as store:
        assert "is missing: import prompts in the Admin tab" in seed_prompts(store, tmp_path / "none.jsonl")


def test_round_command_follows_the_table_of_commands(monkeypatch):
    monkeypatch.setattr(app, "COMMANDS", [("--train-round", None, "", None)])
    assert round_command("d.db", "default") is None
    monkeypatch.setattr(app, "COMMANDS", [("--train-round", None, "", "rlhf.round.run:main")])
    command = round_command("d.db", "default")
    assert command[1].endswith("app.py") and command[2:] == ["--train-round", "--db", "d.db", "--model", "default"]


def test_python_app_py_serves_the_vote_api_that_the_load_bench_drives(capsys):
    # The real `python app.py` in a child process, driven through gradio_client: sign in, vote, next pair, and the
    # database checked afterwards (bench/annotate_load.py with 2 annotators and 4 votes).
    from bench.annotate_load import main as load_bench

    assert load_bench(["--annotators", "2", "--votes", "4", "--think-s", "0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["votes"], summary["lost"], summary["duplicated"], summary["errors"]) == (4, 0, 0, 0)
