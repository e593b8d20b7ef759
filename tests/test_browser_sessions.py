"""Sessions in a real headless Chromium: signed in after a reload and after a server restart (the next key press is
not silently dropped), told so when a session ended, and not signed out by a page load that answers late."""

import sqlite3
import sys
import time

import pytest

from annotate.records import NewGeneration, NewPair
from loop.children.pair_job import GenerationJob
from loop.children.round_runner import RoundRunner
from annotate.store import Store
from annotate.ui import build_app
from annotate.ui_annotate import AnnotateHandlers
from annotate.ui_session import AppConfig
from tests.test_browser import NoGenerator, browser, free_port  # noqa: F401 (browser is a fixture)

pytestmark = pytest.mark.browser


class Server:
    """The app over one database file, started and stopped as a person's server would be."""

    def __init__(self, db, port: int):
        self.db, self.port = db, port
        self.store = self.demo = None

    def start(self) -> None:
        self.store = Store(self.db)
        self.demo = build_app(self.store, GenerationJob(NoGenerator()),
                              RoundRunner(self.store, [sys.executable, "-c", "pass"]), AppConfig(admins=("boss",)))
        self.demo.queue()
        self.demo.launch(server_name="127.0.0.1", server_port=self.port, prevent_thread_lock=True, quiet=True)

    def stop(self) -> None:
        self.demo.close()
        self.store.close()


@pytest.fixture
def server(tmp_path):
    db = tmp_path / "app.db"
    with Store(db) as store:
        store.add_prompts([f"Prompt number {i}" for i in range(1, 5)])
        policy = store.add_policy(0, "base")
        store.add_pairs_bulk([NewPair(i, NewGeneration(policy, f"first {i}", 1, "eos"),
                                      NewGeneration(policy, f"second {i}", 1, "eos")) for i in range(1, 5)])
    running = Server(db, free_port())
    running.start()
    yield running
    running.stop()


def votes(db) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT pair_id, annotator FROM votes ORDER BY id").fetchall()


def wait_for_text(page, selector: str, text: str, timeout: int = 30_000) -> None:
    """Polled every 250 ms, not on animation frames (Playwright's default): across the server restart headless
    Chromium stopped running frames, and a clean clone's run waited out 90 s with the text already on the page."""
    page.wait_for_function("([selector, text]) => { const el = document.querySelector(selector);"
                           " return el && el.innerText.includes(text); }", arg=[selector, text], timeout=timeout,
                           polling=250)


def test_a_session_survives_a_reload_and_a_server_restart_and_says_when_it_ended(browser, server, tmp_path):
    url = f"http://127.0.0.1:{server.port}/"
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto(url)
    assert "Names are not checked" in page.inner_text("#sign-in-note")
    page.locator("#sign-in-name textarea, #sign-in-name input").first.fill("  Alice ")
    page.click("#sign-in-button")
    wait_for_text(page, "#progress", "Signed in as alice")

    page.reload()  # no name typed again: the signed cookie signs her back in
    wait_for_text(page, "#progress", "Signed in as alice")
    page.wait_for_selector("#prompt .untrusted")

    server.stop()
    server.start()  # same port, same database: a new server with nothing in memory
    page.keyboard.press("1")
    # the page reconnects to the new server first: on a loaded 2-core CI machine that passed 30 s once
    wait_for_text(page, "#status", "The app restarted, so that vote was not recorded: please vote again.",
                  timeout=90_000)
    assert votes(server.db) == []
    assert page.is_visible("#prompt") and not page.is_visible("#sign-in-button")
    page.keyboard.press("1")
    wait_for_text(page, "#progress", "your votes: 1")
    assert votes(server.db) == [(1, "alice")]
    page.screenshot(path=str(tmp_path / "after-restart.png"))

    server.stop()
    (tmp_path / "app.db.session-key").unlink()  # a new signing key: every session ends
    server.start()
    page.reload()
    wait_for_text(page, "#sign-in-message", "Your session ended (the app's sign-in key changed); sign in again.")
    assert page.is_visible("#sign-in-button")
    page.screenshot(path=str(tmp_path / "session-ended.png"))
    page.reload()  # the ended cookie was cleared: a plain sign-in form, no message
    page.wait_for_selector("#sign-in-button")
    page.wait_for_timeout(500)
    assert "session ended" not in page.inner_text("#sign-in-message")


def test_a_sign_in_before_the_page_load_answers_is_not_undone_by_it(browser, server, tmp_path, monkeypatch):
    """The page load looks for a session cookie; on a busy server its answer can come after a quick sign-in's. With
    no cookie it must leave the page alone, or it hides the pair just shown and puts the sign-in form back."""
    resume = AnnotateHandlers.resume

    def slow_resume(self, session, request=None):
        time.sleep(3)  # the load's answer comes well after the sign-in's
        return resume(self, session, request)

    monkeypatch.setattr(AnnotateHandlers, "resume", slow_resume)
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.locator("#sign-in-name textarea, #sign-in-name input").first.fill("bob")
    page.click("#sign-in-button")
    wait_for_text(page, "#progress", "Signed in as bob")
    page.wait_for_timeout(5_000)  # past the load's answer
    page.screenshot(path=str(tmp_path / "signed-in-before-load.png"))
    assert page.is_visible("#prompt .untrusted") and not page.is_visible("#sign-in-button")
    page.click("#vote-left")
    page.wait_for_function("() => document.querySelector('#progress').innerText.includes('your votes: 1')")
    assert [who for _pair, who in votes(server.db)] == ["bob"]  # the session the load left alone votes as bob
