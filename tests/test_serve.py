"""`python app.py` (serve): refusing unsafe exposure, auth files, seeding an empty database, the children it starts
(rounds and pair making) with its own configuration."""

import json
import sys

import pytest

import app
from annotate.passwords import AuthFileError, password_checker, read_auth_file
from annotate.serve import ServeError, check_exposure, is_local_host, seed_prompts
from loop.children.pair_child import ChildProcessPairGenerator
from annotate.store import Store
from loop.config_files import load_config
from loop.app_server import child_command, write_child_config


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
    good.write_text("# team\nalice:s3cret:with:colons\n\n  Bob : pw \n")
    assert read_auth_file(good) == {"alice": "s3cret:with:colons", "bob": " pw "}
    bad = tmp_path / "bad.txt"
    bad.write_text("alice:pw\ncarol\n")
    with pytest.raises(AuthFileError, match=r"bad\.txt, line 2: expected name:password"):
        read_auth_file(bad)
    bad.write_text("alice:pw\nALICE:other\n")
    with pytest.raises(AuthFileError, match=r"line 2: alice appears twice \(also line 1\)"):
        read_auth_file(bad)
    bad.write_text("# nobody\n")
    with pytest.raises(AuthFileError, match="holds no name:password line"):
        read_auth_file(bad)
    with pytest.raises(AuthFileError, match="cannot read the auth file"):
        read_auth_file(tmp_path / "missing.txt")


def test_password_checker():
    check = password_checker({"alice": "pw"})
    assert check("alice", "pw") and check(" ALICE ", "pw")
    assert not check("alice", "PW") and not check("bob", "pw") and not check("bob", "\0") and not check("", "")


def test_seed_prompts_only_on_an_empty_database(tmp_path):
    shipped = tmp_path / "prompts.jsonl"
    shipped.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    with Store(":memory:") as store:
        assert seed_prompts(store, shipped) == f"Imported 2 prompts from {shipped}."
        assert seed_prompts(store, shipped) == "" and store.count_prompts() == 2
    with Store(":memory:") as store:
        assert "is missing: import prompts in the Admin tab" in seed_prompts(store, tmp_path / "none.jsonl")


def test_children_of_the_app_read_the_apps_own_configuration(tmp_path):
    config = load_config(None, ["sampling.temperature=0.3", f"app.db={tmp_path / 'team.db'}", "serve.admins=[\"ann\"]"],
                         default_file=None)
    path = write_child_config(config)
    assert path == tmp_path / "team.db.serve.toml"
    command = child_command(path, config, "--generate-pairs", "4")
    assert command[0] == sys.executable and command[1].endswith("app.py")
    assert command[2:6] == ["--generate-pairs", "4", "--config", str(path)]
    assert command[6:].count("--set") == len(command[6:]) // 2 and "pairs.seed=none" in command
    again = load_config(path, command[7::2], default_file=None)
    assert again.as_dict() == config.as_dict() and again.sampling.temperature == 0.3


def test_a_child_keeps_what_the_app_unset_even_when_rlhf_loop_toml_sets_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlhf-loop.toml").write_text('[pairs]\nseed = 5\n[reward]\nwarm_start = "rm-dir"\n')
    config = load_config(None, ["pairs.seed=none", "reward.warm_start=None", "app.db=team.db"])
    assert (config.pairs.seed, config.reward.warm_start) == (None, None)
    command = child_command(write_child_config(config), config, "--train-round")
    child = load_config(command[command.index("--config") + 1], command[command.index("--config") + 3::2])
    assert child.as_dict() == config.as_dict()


def test_pairs_from_a_child_process_report_progress_and_the_pairs_written(tmp_path):
    child = tmp_path / "child.py"
    child.write_text("print('loading the model', flush=True)\n"
                     "for done in (2, 4):\n    print(f'pairs-progress {done} 4', flush=True)\n"
                     "print('pairs-written 3')\n")
    seen = []
    generator = ChildProcessPairGenerator(lambda n, share: [sys.executable, str(child), str(n), str(share)])
    assert generator.generate(4, 0.0, lambda done, total: seen.append((done, total))) == 3
    assert seen == [(2, 4), (4, 4)] and list(generator.log) == ["loading the model"]


def test_the_apps_status_shows_what_the_pair_child_says_it_does(tmp_path):
    # The child's `pairs-stage`, `pairs-step` and `pairs-answers` lines reach the status line of the pages.
    import time

    from loop.children.pair_job import GenerationJob

    child, go_on = tmp_path / "child.py", tmp_path / "go-on"
    child.write_text("import os, sys, time\n"
                     "def wait(name):\n"
                     "    while not os.path.exists(sys.argv[1] + name):\n        time.sleep(0.02)\n"
                     "print('pairs-stage loading the model', flush=True)\nwait('1')\n"
                     "print('pairs-stage generating', flush=True)\nprint('pairs-step 100 512 0.1', flush=True)\n"
                     "wait('2')\nprint('pairs-answers 3 8', flush=True)\n"
                     "print('pairs-progress 1 4', flush=True)\nwait('3')\nprint('pairs-written 1')\n")
    job = GenerationJob(ChildProcessPairGenerator(lambda n, share: [sys.executable, str(child), str(go_on)]))

    def status_when(part: str) -> str:
        deadline = time.monotonic() + 30
        while part not in job.status_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        return job.status_text()

    job.start(4, 0.0, started_by="first start")
    assert status_when("loading the model").startswith("Preparing 4 pairs: loading the model")
    (tmp_path / "go-on1").touch()
    assert "writing the first answers (token 100 of at most 512): the first pairs within " in status_when("token")
    (tmp_path / "go-on2").touch()
    assert status_when("3/8 answers").startswith("Generating pairs: 1/4 ready, 3/8 answers, about ")
    (tmp_path / "go-on3").touch()
    job.wait(30)
    assert job.status_text().startswith("Generated 1 pairs in ")


def test_a_failing_pair_child_raises_with_its_last_words(tmp_path):
    child = tmp_path / "child.py"
    child.write_text("import sys\nprint('app.py --generate-pairs: no such model: nope', file=sys.stderr)\nsys.exit(2)\n")
    generator = ChildProcessPairGenerator(lambda n, share: [sys.executable, str(child)])
    with pytest.raises(RuntimeError, match="exited with code 2: app.py --generate-pairs: no such model: nope"):
        generator.generate(4, 0.0, lambda done, total: None)


def test_python_app_py_serves_the_vote_api_that_the_load_bench_drives(capsys):
    # The real `python app.py` in a child process, driven through gradio_client: sign in, vote, next pair, and the
    # database checked afterwards (bench/annotate_load.py with 2 annotators and 4 votes).
    from bench.annotate_load import main as load_bench

    assert load_bench(["--annotators", "2", "--votes", "4", "--think-s", "0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["votes"], summary["lost"], summary["duplicated"], summary["errors"]) == (4, 0, 0, 0)


def test_the_first_pair_bench_times_a_first_start_of_the_real_app(tiny_model_dir, capsys):
    # bench/first_pair.py on the tiny model: the real `python app.py`, a fresh database, a first batch of 2 pairs.
    from bench.first_pair import main as first_pair_bench

    assert first_pair_bench(["--watch-s", "0", "--all", "--timeout-s", "120", "--", "--model", str(tiny_model_dir),
                             "--first-batch", "4", "--set", "sampling.max_new_tokens=8",
                             "--set", "sampling.temperature=3.0"]) == 0  # flat draws: no two answers alike
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert 0 < summary["seconds_to_page"] <= summary["seconds_to_first_pair"] <= summary["seconds_to_all_pairs"]
    assert summary["pairs_at_end"] >= 1 and summary["pairs_after_0_s"] is not None
    assert captured.err.startswith("CPU: ")


@pytest.mark.slow
def test_the_server_process_loads_no_torch_while_its_child_makes_the_first_pairs(tmp_path, tiny_model_dir):
    # The real `python app.py` on a fresh database: the first batch is made by a child process on the tiny model, and
    # the server itself (what answers votes) never maps torch's library.
    import subprocess
    import time
    from pathlib import Path

    from bench.annotate_load import free_port, wait_until_up

    root = Path(__file__).resolve().parents[1]
    db, port = tmp_path / "app.db", free_port()
    with open(tmp_path / "app.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, str(root / "app.py"), "--db", str(db), "--port", str(port), "--model", str(tiny_model_dir),
             "--first-batch", "2", "--set", "sampling.max_new_tokens=8"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_up(f"http://127.0.0.1:{port}/", server)
            deadline = time.monotonic() + 120
            pairs = 0
            while pairs < 1 and time.monotonic() < deadline and server.poll() is None:
                time.sleep(0.5)
                with Store(db) as store:
                    pairs = store.count_pairs()
            maps = Path(f"/proc/{server.pid}/maps").read_text()
        finally:
            server.terminate()
            server.wait(10)
    assert pairs >= 1, (tmp_path / "app.log").read_text()[-2000:]
    assert "libtorch" not in maps
    assert (tmp_path / "app.db.serve.toml").is_file()
