"""Sessions that survive a reload and a server restart: the annotate handlers called as plain functions with the
signed session cookie a browser would send (the real-browser version is in tests/test_browser_sessions.py)."""

from types import SimpleNamespace

import pytest

from loop.children.pair_job import GenerationJob
from annotate.identity import SessionTokens
from annotate.store import Store
from annotate.ui_annotate import AnnotateHandlers
from annotate.ui_session import AppConfig, Session, session_cookie, signed_in_name
from tests.test_ui import FakeGenerator, idle_runner, seed_pairs


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts():
    with Store(":memory:") as store:
        seed_pairs(store, 3)
        clock = Clock()
        config = AppConfig(admins=("boss",), sessions=SessionTokens(b"s" * 32, "cookie", clock=clock))
        store.set_role("boss", "admin")
        job, runner = GenerationJob(FakeGenerator(store)), idle_runner(store)
        yield SimpleNamespace(store=store, config=config, clock=clock,
                              annotate=AnnotateHandlers(store, config, job, runner))


def browser_with(cookie: str | None) -> SimpleNamespace:
    """The request of a browser that holds this session cookie (a `document.cookie` assignment), or none."""
    if cookie is None:
        return SimpleNamespace(cookies={}, username=None)
    name, _, rest = cookie.partition("=")
    return SimpleNamespace(cookies={name: rest.split(";")[0]}, username=None)


def test_signing_in_gives_a_cookie_that_signs_the_next_page_load_back_in(parts):
    session, view, _ = parts.annotate.sign_in("Carol  Smith", Session())
    cookie = session_cookie(session, parts.config)
    assert cookie.startswith("cookie=v1.") and cookie.endswith("; Max-Age=1209600; Path=/; SameSite=Strict")
    # a reload: a fresh server-side session, the same browser
    resumed, view, ended = parts.annotate.resume(Session(), browser_with(cookie))
    assert (resumed.name, view.signed_in, view.pair_id, ended) == ("carol smith", True, 1, "")
    assert "Signed in as **carol smith** (annotator)" in view.progress
    # the cookie is renewed on every load: a session lasts 14 days from the last visit
    parts.clock.now += 100
    assert session_cookie(resumed, parts.config) != cookie


def test_a_load_without_a_cookie_shows_the_sign_in_form_without_a_word(parts):
    session, view, ended = parts.annotate.resume(Session(), browser_with(None))
    assert (session.name, view.signed_in, ended) == (None, False, "")
    assert session_cookie(session, parts.config, ended) == ""


def test_an_expired_or_foreign_cookie_says_the_session_ended_and_is_cleared(parts):
    session, _, _ = parts.annotate.sign_in("alice", Session())
    cookie = session_cookie(session, parts.config)
    parts.clock.now += 14 * 86400
    session, view, ended = parts.annotate.resume(Session(), browser_with(cookie))
    assert (session.name, view.signed_in) == (None, False)
    assert ended == "Your session ended (sessions last 14 days); sign in again."
    assert session_cookie(session, parts.config, ended) == "cookie=; Max-Age=0; Path=/; SameSite=Strict"
    foreign = SessionTokens(b"other" * 8, "cookie").cookie(SessionTokens(b"other" * 8).issue("boss"))
    _, view, ended = parts.annotate.resume(Session(), browser_with(foreign))
    assert not view.signed_in and ended == "Your session ended (the app's sign-in key changed); sign in again."
    assert parts.store.votes() == []


def test_a_vote_after_a_server_restart_is_not_misread_and_the_person_stays_signed_in(parts):
    session, view, _ = parts.annotate.sign_in("alice", Session())
    cookie = session_cookie(session, parts.config)
    # The server restarted: this tab's server-side state is new, the page still shows pair 1 and the cookie is kept.
    session, view = parts.annotate.vote("left", 1, "", Session(), browser_with(cookie))
    assert view.signed_in and session.name == "alice" and view.pair_id == 1
    assert view.status == "The app restarted, so that vote was not recorded: please vote again."
    assert parts.store.votes() == []
    session, view = parts.annotate.vote("left", 1, "", session, browser_with(cookie))
    assert view.recorded and [(v.pair_id, v.annotator) for v in parts.store.votes()] == [(1, "alice")]


def test_a_vote_whose_session_ended_says_so_on_the_sign_in_form(parts):
    session, _, _ = parts.annotate.sign_in("alice", Session())
    cookie = session_cookie(session, parts.config)
    parts.clock.now += 15 * 86400
    _, view = parts.annotate.vote("left", 1, "", Session(), browser_with(cookie))
    assert not view.signed_in and view.status == "Your session ended (sessions last 14 days); sign in again."
    _, view = parts.annotate.vote("left", 1, "", Session(), browser_with(None))
    assert not view.signed_in and view.status == "Sign in first."


def test_admin_rights_follow_the_signed_cookie_not_the_form(parts):
    boss = session_cookie(parts.annotate.sign_in("boss", Session())[0], parts.config)
    after_restart = signed_in_name(Session(), browser_with(boss), parts.config)
    assert after_restart == "boss" and parts.store.is_admin(after_restart)
    mallory = browser_with(boss.replace("v1.Ym9zcw", "v1.bWFsbG9yeQ"))  # the name swapped, the signature kept
    assert "v1.bWFsbG9yeQ" in mallory.cookies["cookie"] and signed_in_name(Session(), mallory, parts.config) is None


def test_with_an_auth_file_the_login_name_is_normalised_and_no_cookie_is_written(parts):
    config = AppConfig(require_auth=True)
    assert signed_in_name(Session(), SimpleNamespace(username=" ALICE "), config) == "alice"
    assert signed_in_name(Session(name="bob"), SimpleNamespace(username=None), config) is None
    handlers = AnnotateHandlers(parts.store, config, parts.annotate.job, parts.annotate.runner)
    session, _view, _ = handlers.sign_in("", Session(), SimpleNamespace(username="Alice"))
    assert session.name == "alice" and session_cookie(session, config) == ""
