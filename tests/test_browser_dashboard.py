"""The Dashboard in a real headless Chromium after a real round of the tiny model: the accuracy, its interval and the
people's win rate on the page are the store's, every panel draws without pressing Refresh, and it reads on a laptop
and on a phone (screenshots saved beside the test's files)."""

from __future__ import annotations

import pytest

from annotate.dashboard_panels import accuracy_text, win_rate_text
from annotate.store import Store
from annotate.ui_session import AppConfig
from tests.test_browser import browser, served  # noqa: F401 (browser is a fixture)
from tests.test_dashboard import demo_db  # noqa: F401 (a fixture: one demo round of the tiny model)

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_thread")]


@pytest.fixture
def dashboard_url(demo_db):  # noqa: F811
    store = Store(demo_db)
    with served(store, AppConfig(admins=("boss",), refresh_s=60)) as url:
        yield url, store


def wait_for_text(page, selector: str, text: str) -> None:
    page.wait_for_function("([selector, text]) => { const el = document.querySelector(selector);"
                           " return el && el.innerText.includes(text); }", arg=[selector, text], timeout=15_000)


def open_dashboard(page, url: str) -> None:
    page.goto(url)
    page.locator("#sign-in-name textarea, #sign-in-name input").first.fill("boss")
    page.click("#sign-in-button")
    wait_for_text(page, "#progress", "Signed in as boss")
    page.get_by_role("tab", name="Dashboard").click()  # opening the tab, not Refresh
    wait_for_text(page, "#dashboard-headline", "Round 1")


@pytest.mark.parametrize("width, height", [(1366, 900), (390, 844)])
def test_the_dashboard_shows_the_stores_numbers_in_every_panel(browser, dashboard_url, tmp_path, width, height):  # noqa: F811
    url, store = dashboard_url
    (done,) = store.rounds()
    (newest,) = [w for w in store.versus_win_rates() if w.policy_id == done.metrics["round/policy_id"]]
    page = browser.new_page(viewport={"width": width, "height": height})
    open_dashboard(page, url)
    headline = page.inner_text("#dashboard-headline")
    assert accuracy_text(done.metrics) in headline and win_rate_text(newest) in headline
    assert f"{newest.wins} wins, {newest.losses} losses, {newest.ties} ties, {newest.both_bad} both bad" in headline
    rounds_table = page.inner_text("#rounds-table")
    assert accuracy_text(done.metrics) in rounds_table
    assert win_rate_text(newest) in page.inner_text("#win-rates-table")
    # every panel across rounds and within the round holds a drawn line, none an empty note
    for selector in ("#dashboard-across", "#dashboard-within"):
        figures = page.locator(f"{selector} figure.plot")
        assert figures.count() >= 2
        assert figures.locator("polyline").count() >= figures.count()
        assert page.locator(f"{selector} .empty").count() == 0
    assert page.locator("#dashboard-across figure.plot").count() == 6  # accuracy, win rate, reward, KL, votes, judge
    # on a phone the panels stack: none is wider than the screen
    widest = page.evaluate("() => Math.max(...[...document.querySelectorAll('#dashboard-across figure.plot')]"
                           ".map(f => f.getBoundingClientRect().right))")
    assert widest <= width + 1
    page.screenshot(path=str(tmp_path / f"dashboard-{width}x{height}.png"), full_page=True)


def test_an_admin_sees_who_looks_careless_and_why_in_the_people_table(browser, demo_db, tmp_path):  # noqa: F811
    from tests.test_report import copy_database

    db = copy_database(demo_db, tmp_path / "team.db")
    with Store(db) as store:  # someone who always took the answer shown on the left, on 24 new pairs
        policy = store.first_policy()
        store.add_annotator("lefty")
        for i in range(24):
            store.add_prompts([f"Careless question {i}?"], source="test")
            prompt_id = store.prompts()[-1].id
            pair = store.add_pair(prompt_id, store.add_generation(prompt_id, policy.id, f"left {i}", 2, "eos"),
                                  store.add_generation(prompt_id, policy.id, f"right {i}", 2, "eos"))
            store.record_vote(pair, "lefty", "a" if i % 2 else "b", a_on_left=bool(i % 2), seconds=0.4)
    store = Store(db)
    with served(store, AppConfig(admins=("boss",), refresh_s=60)) as url:
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        open_dashboard(page, url)
        page.get_by_text("People (admins)").click()  # a closed accordion below the tables
        wait_for_text(page, "#people-table", "lefty")
        table = page.inner_text("#people-table")
        assert "looks careless" in table and "gold accuracy" in table
        assert "picks the left answer in 100% of 24 a/b votes (p = 1e-07); a median of 0.4 s a pair" in table
        page.screenshot(path=str(tmp_path / "people-table.png"), full_page=True)
