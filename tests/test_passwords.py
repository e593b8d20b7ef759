"""Passwords done properly: scrypt hashes in the auth file, `--add-user` and `--upgrade-auth`, warnings for plain
text and loose modes, and back-off for guessed passwords per name and per client address (over real HTTP)."""

import io
import os
import re
import stat
import sys
import time

import pytest

import app
from annotate.passwords import (
    AuthFileError, LoginThrottle, auth_file_warnings, hash_password, password_checker, read_auth_file, set_password,
    upgrade_auth_file, verify_password,
)
from annotate.store import Store

CHEAP = {"n": 2**10}  # the cost is recorded in each line; tests hash cheaply
HASH_LINE = re.compile(r"^(?P<name>[^:]+):scrypt\$(?P<n>\d+)\$8\$1\$[A-Za-z0-9+/]{22}==\$[A-Za-z0-9+/]{43}=$")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_password_is_stored_as_salted_scrypt_with_its_cost():
    stored = hash_password("correct horse")
    assert HASH_LINE.match(f"ann:{stored}")["n"] == str(2**15)
    assert verify_password("correct horse", stored) and not verify_password("correct hors", stored)
    assert hash_password("correct horse") != stored  # salted
    cheap = hash_password("pw", **CHEAP)
    assert cheap.startswith("scrypt$1024$8$1$") and verify_password("pw", cheap)
    assert verify_password("plain", "plain") and not verify_password("plain", "other")  # an old plain line


def test_add_user_writes_a_0600_file_and_replaces_the_same_persons_line(tmp_path):
    path = tmp_path / "auth.txt"
    assert set_password(path, "Ann", "correct horse", **CHEAP) == ("ann", False)
    assert mode(path) == 0o600
    assert set_password(path, "bob", "battery staple", **CHEAP) == ("bob", False)
    first = path.read_text().splitlines()
    assert set_password(path, " ANN ", "new password", **CHEAP) == ("ann", True)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# rlhf-loop auth file") and lines[2] == first[2]  # bob's line kept as it was
    assert [HASH_LINE.match(line)["name"] for line in lines[1:]] == ["ann", "bob"]
    credentials = read_auth_file(path)
    assert verify_password("new password", credentials["ann"]) and auth_file_warnings(path, credentials) == []
    with pytest.raises(AuthFileError, match="at least 8 characters"):
        set_password(path, "cid", "short")
    with pytest.raises(AuthFileError, match="cannot hold ':'"):
        set_password(path, "a:b", "long enough")
    with pytest.raises(AuthFileError, match="invisible or control characters"):
        set_password(path, "ali\u200bce", "long enough")


def test_a_plain_file_loads_with_warnings_and_one_command_upgrades_it(tmp_path):
    path = tmp_path / "people.txt"
    path.write_text("# team\nalice:s3cret:with:colons\nBob:hunter22\n")
    path.chmod(0o644)
    credentials = read_auth_file(path)
    assert credentials == {"alice": "s3cret:with:colons", "bob": "hunter22"}
    assert auth_file_warnings(path, credentials) == [
        (f"{path} holds 2 plain-text password(s) (alice, bob): store them as scrypt hashes with "
         f"python app.py --upgrade-auth {path}"),
        f"{path} can be read by other users of this machine (mode 0644): chmod 600 {path}",
    ]
    upgraded, backup = upgrade_auth_file(path, **CHEAP)
    assert (upgraded, backup) == (2, tmp_path / "people.txt.bak")
    assert backup.read_text() == "# team\nalice:s3cret:with:colons\nBob:hunter22\n" and mode(backup) == 0o600
    lines = path.read_text().splitlines()
    assert lines[0] == "# team" and [HASH_LINE.match(line)["name"] for line in lines[1:]] == ["alice", "bob"]
    credentials = read_auth_file(path)
    assert verify_password("s3cret:with:colons", credentials["alice"]) and verify_password("hunter22", credentials["bob"])
    assert upgrade_auth_file(path) == (0, None)


def test_a_broken_hash_line_names_the_line(tmp_path):
    path = tmp_path / "auth.txt"
    path.write_text("ann:scrypt$1024$8$1$notbase64!$x\n")
    with pytest.raises(AuthFileError, match=r"auth\.txt, line 1: a broken scrypt"):
        read_auth_file(path)


def test_add_user_and_upgrade_auth_commands(tmp_path, monkeypatch, capsys):
    auth, db = tmp_path / "auth.txt", tmp_path / "team.db"
    monkeypatch.setattr(sys, "stdin", io.StringIO("correct horse\n"))  # not a terminal: one line from stdin
    assert app.main(["--add-user", "Ann", "--role", "admin", "--auth", str(auth), "--db", str(db)]) == 0
    assert capsys.readouterr().out == f"Added ann in {auth}.\nann is admin in {db}.\n"
    assert verify_password("correct horse", read_auth_file(auth)["ann"])
    with Store(db) as store:
        assert store.role_of("ann") == "admin"

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    typed = iter(["battery staple", "battery stapel"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(typed))
    assert app.main(["--add-user", "bob", "--auth", str(auth)]) == 2
    assert capsys.readouterr().err == "app.py: The two passwords differ: nothing was written.\n"
    assert set(read_auth_file(auth)) == {"ann"}

    plain = tmp_path / "plain.txt"
    plain.write_text("cid:open sesame\n")
    assert app.main(["--upgrade-auth", str(plain)]) == 0
    assert "Stored 1 password(s)" in capsys.readouterr().out and (tmp_path / "plain.txt.bak").exists()
    assert verify_password("open sesame", read_auth_file(plain)["cid"])


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_back_off_doubles_after_five_failures_up_to_a_cap_and_a_success_clears_it():
    clock = Clock()
    throttle = LoginThrottle(free_failures=5, max_delay_s=8, forget_after_s=3600, clock=clock)
    waits = []
    for _ in range(9):
        throttle.failed("alice")
        waits.append(throttle.wait_s("alice"))
        clock.now += waits[-1]  # the next attempt comes as soon as it is let through
    assert waits == [0, 0, 0, 0, 1, 2, 4, 8, 8]
    assert throttle.wait_s("bob") == 0  # per key
    throttle.succeeded("alice")
    assert throttle.wait_s("alice") == 0
    for _ in range(5):
        throttle.failed("carol")
    clock.now += 3600
    throttle.failed("carol")  # an hour later the count starts again
    assert throttle.wait_s("carol") == 0


def test_the_checker_refuses_even_the_right_password_while_a_name_or_an_address_waits():
    clock = Clock()
    address = {"now": "10.0.0.5"}
    by_name = LoginThrottle(free_failures=5, clock=clock)
    by_address = LoginThrottle(free_failures=8, clock=clock)
    check = password_checker({"alice": hash_password("right one", **CHEAP), "bob": "plain pw"}, by_name, by_address,
                             client_address=lambda: address["now"])
    assert [check("alice", "wrong") for _ in range(5)] == [False] * 5
    assert not check("alice", "right one")  # waiting out 1 s: refused without checking
    assert check("bob", "plain pw")  # another name from the same address still works
    clock.now += 1
    assert check("ALICE", "right one")
    assert by_name.wait_s("alice") == 0
    for name in ("carol", "dan", "eve"):  # 8 failures in all from this address: the address waits
        check(name, "guess")
    assert by_address.wait_s("10.0.0.5") == 1
    assert not check("bob", "plain pw")
    address["now"] = "10.0.0.6"
    assert check("bob", "plain pw")


def test_gradio_login_over_http_backs_off_by_name_and_sees_the_client_address(tmp_path):
    # The real login route of a launched app, with the middleware loop.app_server adds: Gradio gives the auth function
    # no request, so the address comes from ClientAddressMiddleware.
    import httpx
    from starlette.middleware import Middleware

    from annotate.passwords import ClientAddressMiddleware
    from loop.children.pair_job import GenerationJob
    from loop.children.round_runner import RoundRunner
    from annotate.ui import build_app
    from annotate.ui_session import AppConfig
    from tests.test_browser import NoGenerator, free_port

    by_name, by_address = LoginThrottle(free_failures=5), LoginThrottle(free_failures=20)
    store = Store(":memory:")
    demo = build_app(store, GenerationJob(NoGenerator()), RoundRunner(store, [sys.executable, "-c", "pass"]),
                     AppConfig(require_auth=True))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                auth=password_checker({"alice": hash_password("right horse", **CHEAP)}, by_name, by_address),
                app_kwargs={"middleware": [Middleware(ClientAddressMiddleware)]})
    try:
        def login(name, password):
            return httpx.post(f"http://127.0.0.1:{port}/login", data={"username": name, "password": password}).status_code

        assert [login("alice", "wrong") for _ in range(5)] == [400] * 5
        assert by_address.failures("127.0.0.1") == 5 and by_name.failures("alice") == 5
        assert login("Alice", "right horse") == 400  # waiting out 1 s
        time.sleep(1.1)
        assert login("Alice", "right horse") == 200
    finally:
        demo.close()
        store.close()
