"""The Admin tab's "People and gold pairs" in a real headless Chromium: an admin picks an annotator, presses Exclude,
reads the status line and the store has them excluded; then marks a pair gold, and the pair careful annotators agree
on as proposed (screenshot saved beside the test's files)."""

from __future__ import annotations

import pytest

from annotate.store import Store
from annotate.ui_session import AppConfig
from tests import test_browser
from tests.test_browser import served
from tests.test_browser_dashboard import wait_for_text
from tests.test_exclusion import two_annotator_store

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the headless Chromium fixture


def test_an_admin_excludes_an_annotator_and_marks_a_gold_pair_with_the_buttons(browser, tmp_path):
    db = tmp_path / "team.db"
    setup, pairs = two_annotator_store(db)
    setup.record_vote(pairs[2], "other", "a", a_on_left=True)  # pair 3: careful and other agree on a
    setup.close()
    store = Store(db)
    with served(store, AppConfig(admins=("boss",), refresh_s=60)) as url:
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.goto(url)
        page.locator("#sign-in-name textarea, #sign-in-name input").first.fill("boss")
        page.click("#sign-in-button")
        wait_for_text(page, "#progress", "Signed in as boss")
        page.get_by_role("tab", name="Admin").click()
        page.get_by_text("People and gold pairs").click()  # a closed accordion: opening it fills the names
        page.locator("#exclude-name input").click()
        page.get_by_role("option", name="careless", exact=True).click()
        page.click("#exclude-button")
        wait_for_text(page, "#exclusion-message", "Excluded careless")
        assert page.inner_text("#exclusion-message") == (
            "Excluded careless: their 4 votes stay in the database, left out of the next rounds and of promotion.")
        assert store.excluded_annotators() == ["careless"]
        page.locator("#gold-pair-id input").fill("2")
        page.click("#gold-button")
        wait_for_text(page, "#gold-message", "is a gold pair")
        assert page.inner_text("#gold-message").startswith("Pair 2 (“Question 1?”) is a gold pair, answer a right")
        assert store.gold_pair_ids() == [2]
        # careless excluded: pair 3's careful voters agree, so it is proposed (the table refreshes after Mark gold)
        wait_for_text(page, "#gold-proposals", "Question 2?")
        page.click("#accept-proposals")
        wait_for_text(page, "#accept-message", "Marked 1 proposed pairs gold")
        assert store.gold_pair_ids() == [2, 3] and store.pair(3).gold == "a"
        page.locator("#people-admin").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "people-admin.png"), full_page=True)
