"""One writer where one is meant: one annotation app per database, a port checked before anything is written, every
`--add-user` of many at once kept, a round that outlives the app that started it, and stale rounds judged by the
round lock rather than by a pid that may since belong to another process."""

import io
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
import loop.app_server
from annotate.passwords import read_auth_file, verify_password
from annotate.serve import ServeError
from annotate.store import Store
from loop.children.liveness import process_is_alive
from loop.children.round_runner import RoundRunner
from loop.round_lock import RoundLock

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.fixture()
def launches(tmp_path, monkeypatch):
    """`python app.py` with build_app replaced; yields the launches (`calls`). With `block` set, the first launch
    blocks (it serves) until `release` is set; any other returns at once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    monkeypatch.setenv("GRADIO_ANALYTICS_MAX_EVENTS", "1000")
    launched = SimpleNamespace(calls=[], block=False, release=threading.Event())

    class Demo:
        def queue(self, **kwargs):
            return self

        def launch(self, **kwargs):
            launched.calls.append(kwargs)
            if launched.block and len(launched.calls) == 1:
                launched.release.wait(30)

    monkeypatch.setattr(loop.app_server, "build_app", lambda *args, **kwargs: Demo())
    yield launched
    launched.release.set()


def test_a_second_app_on_the_same_database_is_refused_naming_the_first(launches, tmp_path, capsys):
    db, port = str(tmp_path / "team.db"), free_port()
    launches.block = True
    first = threading.Thread(target=app.main, args=(["--db", db, "--port", str(port)],), daemon=True)
    first.start()
    try:
        assert wait_for(lambda: len(launches.calls) == 1), capsys.readouterr().err
        assert app.main(["--db", db, "--port", str(free_port())]) == 2
        assert len(launches.calls) == 1  # the second never served
        assert (f"app.py: another annotation app (process {os.getpid()}, port {port}) serves {db}; open that one, "
                "or stop it first") in capsys.readouterr().err
    finally:
        launches.release.set()
        first.join(10)
    # the first app's lock went with it: the database can be served again
    assert app.main(["--db", db, "--port", str(free_port())]) == 0 and len(launches.calls) == 2


def test_a_port_in_use_is_refused_before_anything_is_written(launches, tmp_path, capsys):
    db = tmp_path / "team.db"
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        port = other_program.getsockname()[1]
        assert app.main(["--db", str(db), "--port", str(port)]) == 2
    assert (f"app.py: port {port} on 127.0.0.1 is in use (by another program); start with --port N or stop that "
            "program") in capsys.readouterr().err
    assert launches.calls == [] and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_a_port_out_of_range_is_refused_before_anything_is_written(launches, tmp_path, capsys, port):
    assert app.main(["--db", str(tmp_path / "team.db"), "--port", str(port)]) == 2
    assert "65535" in capsys.readouterr().err
    assert launches.calls == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(ServeError, match=f"^--port must be a number from 1 to 65535, not {port}.$"):
        loop.app_server.check_port("127.0.0.1", port)


def add_user_at_the_barrier(barrier, auth: str, name: str) -> None:
    """A forked `python app.py --add-user NAME --auth FILE` that reads its password from stdin, let go with the
    others at once."""
    sys.stdin = io.StringIO(f"password-of-{name}\n")
    sys.stdout = sys.stderr = io.StringIO()
    barrier.wait(30)
    sys.exit(app.main(["--add-user", name, "--auth", auth]))


def test_eight_add_users_at_once_all_survive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    auth, names = tmp_path / "auth.txt", [f"person{i}" for i in range(8)]
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(names))
    processes = [context.Process(target=add_user_at_the_barrier, args=(barrier, str(auth), name)) for name in names]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0] * len(names)
    stored = read_auth_file(auth)
    assert sorted(stored) == names
    assert verify_password("password-of-person3", stored["person3"])


ROUND_SCRIPT = """
import pathlib, sys, time
for step in range(6):
    print('round step', step, flush=True)
    time.sleep(0.25)
pathlib.Path(sys.argv[1]).write_text('finished')
"""

APP_SCRIPT = """
import json, sys, time
from annotate.store import Store
from loop.children.round_runner import RoundRunner
db, round_script, marker = sys.argv[1:]
runner = RoundRunner(Store(db), [sys.executable, round_script, marker])
started, message = runner.start('boss')
print(json.dumps({'started': started, 'message': message, 'log': str(getattr(runner, 'log_path', ''))}), flush=True)
time.sleep(60)
"""


def test_a_round_goes_on_after_ctrl_c_stops_the_app_that_started_it(tmp_path):
    # The app in a process group of its own, as in a terminal: Ctrl-C sends SIGINT to the whole group.
    round_script, marker = tmp_path / "round.py", tmp_path / "round-finished"
    round_script.write_text(ROUND_SCRIPT)
    db = tmp_path / "team.db"
    errors = tmp_path / "app.err"
    with open(errors, "w") as stderr:
        # SIGINT as a terminal gives it: a test run started in the background (nohup, `&`) ignores SIGINT, and
        # a Python started with SIGINT ignored never raises KeyboardInterrupt
        parent = subprocess.Popen([sys.executable, "-c", APP_SCRIPT, str(db), str(round_script), str(marker)],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = parent.stdout.readline()
        assert line, errors.read_text()
        started = json.loads(line)
        assert started["started"], started["message"]
        round_pid = int(re.search(r"process (\d+)", started["message"]).group(1))
        time.sleep(0.3)  # the round is under way
        os.killpg(parent.pid, signal.SIGINT)
        parent.wait(10)
    finally:
        parent.kill()
        parent.wait()
    assert wait_for(lambda: marker.exists() or not process_is_alive(round_pid))
    assert marker.read_text() == "finished"
    log = Path(started["log"])
    assert log.parent == tmp_path and log.name.startswith("team.db.round-") and log.suffix == ".log"
    assert log.read_text().splitlines() == [f"round step {step}" for step in range(6)]


def test_the_round_log_is_a_file_beside_the_database_named_on_the_admin_page(tmp_path):
    db = tmp_path / "team.db"
    with Store(db) as store:
        runner = RoundRunner(store, [sys.executable, "-c", "import time; print('step 1', flush=True); time.sleep(0.5)"])
        assert runner.start("boss")[0]
        status = runner.status_text()
        assert runner.wait(10) == 0
        log = runner.log_path
        assert f"(output in {log})" in status and f"(output in {log})" in runner.status_text()
        assert log.read_text() == "step 1\n" and runner.log_text().splitlines()[1] == "step 1"
        assert log.name.startswith("team.db.round-") and len(log.name) == len("team.db.round-20250101-120000.log")


def test_a_running_round_whose_pid_now_belongs_to_another_process_does_not_block_a_start(tmp_path):
    # After a reboot the round's pid may belong to any live process (here: this test's). The round lock is free, so no
    # round runs: the row is stale.
    db = tmp_path / "team.db"
    with Store(db) as store:
        stale = store.start_round(pid=os.getpid())
        runner = RoundRunner(store, [sys.executable, "-c", "print('round')"])
        assert "running in another process" not in runner.status_text()
        started, message = runner.start("boss")
        assert started, message
        assert runner.wait(10) == 0
        assert store.round(stale).status == "failed"


def test_a_round_holding_the_round_lock_blocks_a_start(tmp_path):
    db = tmp_path / "team.db"
    with Store(db) as store, RoundLock(db):
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            running = store.start_round(pid=sleeper.pid)
            runner = RoundRunner(store, [sys.executable, "-c", "print('round')"])
            assert runner.status_text().startswith(f"Round {running} is running in another process ({sleeper.pid})")
            started, message = runner.start("boss")
            assert not started and message.startswith(f"Round {running} is already running (process {sleeper.pid}")
        finally:
            sleeper.kill()
            sleeper.wait()
        assert store.round(running).status == "running"


def test_the_lock_probe_tells_held_from_free_without_taking_or_making_it(tmp_path):
    lock = RoundLock(tmp_path / "team.db")
    assert not lock.is_held() and not lock.path.exists()  # the probe makes no file
    with RoundLock(tmp_path / "team.db"):
        assert lock.is_held() and lock.is_held()  # and takes nothing
        assert lock.holder() == str(os.getpid())
    assert not lock.is_held()
    assert lock.acquire() is lock and lock.is_held()
    lock.release()
