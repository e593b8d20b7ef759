"""Voting on any screen, in headless Chromium at a laptop size (1366x900) and a phone size (390x844): the vote
buttons stay in reach beside 3,000-word answers, a 100 KB prompt is folded and the page stays about a screen tall,
and after a mouse vote the next prompt shows from its top. Screenshots go to each test's tmp_path."""

import sqlite3

import pytest

from annotate.records import NewGeneration, NewPair
from annotate.store import Store
from annotate.ui_session import AppConfig
from test_browser import browser, served  # noqa: F401 (browser: fixture)

pytestmark = pytest.mark.browser

SCREENS = {"laptop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
LONG_ANSWER = " ".join(f"word{i % 97}" for i in range(3000))
HUGE_PROMPT = "Please summarise the following log.\n" + "\n".join(f"line {i}: " + "x" * 90 for i in range(150))
"""About 15,000 characters: under [app] max_prompt_chars (16,000), and hundreds of lines tall on any screen."""
MARKDOWN_ANSWER = "| name | score |\n|---|---|\n| ada | 9 |\n\n```\nprint('hi')\n```\n\nUse `x` here."


@pytest.fixture
def screens_app(tmp_path):
    """Pairs in order: two with 3,000-word answers; a 100 KB prompt; a table and a code block; a plain one."""
    store = Store(tmp_path / "screens.db")
    store.add_prompts(["Explain photosynthesis in depth.", "Explain the tides in depth.", HUGE_PROMPT,
                       "Show me a table and some code.", "Plain prompt 5"])
    policy = store.add_policy(0, "base")
    answers = [(LONG_ANSWER, LONG_ANSWER[::-1]), (LONG_ANSWER[::-1], LONG_ANSWER), ("Short.", "Also short."),
               (MARKDOWN_ANSWER, "No table."), ("five a", "five b")]
    store.add_pairs_bulk([NewPair(i, NewGeneration(policy, a, 9, "eos"), NewGeneration(policy, b, 9, "eos"))
                          for i, (a, b) in enumerate(answers, start=1)])
    with served(store, AppConfig(admins=("boss",), refresh_s=0.5)) as url:
        yield url, tmp_path / "screens.db"


PROMPT_JS = "document.querySelector('#prompt :is(details.long-prompt, div.untrusted)')"


def prompt_text(page) -> str:
    """What the prompt box shows (a folded prompt: its start and the "show all" line)."""
    return page.evaluate(f"() => {PROMPT_JS}.innerText")


def sign_in(page, url: str, name: str) -> None:
    page.goto(url)
    page.locator("#sign-in-name textarea, #sign-in-name input").first.fill(name)
    page.click("#sign-in-button")
    page.wait_for_function(f"() => {PROMPT_JS}", timeout=30_000)  # generous: the test machines are shared


def wait_for_new_prompt(page, before: str) -> str:
    page.wait_for_function(f"(before) => {PROMPT_JS} && {PROMPT_JS}.innerText !== before", arg=before, timeout=10_000)
    return prompt_text(page)


def vote_buttons_in_view(page) -> list[str]:
    """The vote buttons whose box is not wholly inside the viewport (empty: all in reach without scrolling)."""
    return page.evaluate("""() => [...document.querySelectorAll('#vote-bar button')].filter((b) => {
        const r = b.getBoundingClientRect();
        return !(r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth);
    }).map((b) => b.id)""")


def page_height_in_screens(page) -> float:
    return page.evaluate("() => document.documentElement.scrollHeight / window.innerHeight")


@pytest.mark.parametrize("screen", SCREENS)
def test_vote_buttons_stay_in_reach_long_prompts_fold_and_the_next_prompt_shows_from_its_top(
        browser, screens_app, tmp_path, screen):
    url, db = screens_app
    page = browser.new_page(viewport=SCREENS[screen])
    sign_in(page, url, "alice")
    first = prompt_text(page)
    assert "photosynthesis" in first
    assert vote_buttons_in_view(page) == []  # beside two 3,000-word answers
    assert page_height_in_screens(page) < 3
    page.screenshot(path=str(tmp_path / f"{screen}-long-answers.png"))

    for box in ("#answer-left", "#answer-right"):  # read both answers to their ends, then the page to its bottom
        page.locator(box).evaluate("(box) => box.scrollTop = box.scrollHeight")
    page.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
    page.wait_for_function("() => window.scrollY > 0")
    assert vote_buttons_in_view(page) == []
    page.click("#vote-left")  # a mouse click (a tap on a phone)
    second = wait_for_new_prompt(page, first)
    # the next pair is as tall, so only the page's script can have brought its top (and the answers' tops) back
    page.wait_for_function("() => window.scrollY === 0 && document.getElementById('answer-left').scrollTop === 0"
                           " && document.getElementById('answer-right').scrollTop === 0")
    assert second == "Explain the tides in depth." and page_height_in_screens(page) > 1
    assert page.evaluate("() => document.getElementById('prompt').getBoundingClientRect().top") >= 0
    assert "Recorded: A slightly better." in page.inner_text("#status") and vote_buttons_in_view(page) == []
    page.click("#vote-right")
    second = wait_for_new_prompt(page, second)

    # the 100 KB prompt: its start and a "show all" fold; the page stays about a screen tall
    assert [line for line in second.splitlines() if line][:2] == [
        f"Show all ({len(HUGE_PROMPT):,} characters)", "Please summarise the following log."]
    assert page_height_in_screens(page) < 3 and vote_buttons_in_view(page) == []
    page.screenshot(path=str(tmp_path / f"{screen}-huge-prompt.png"))
    page.click("#prompt summary .show-all")
    page.wait_for_function("() => document.querySelector('#prompt details').open")
    assert "line 149: " in page.inner_text("#prompt details")
    assert page.locator("#prompt").evaluate("(box) => box.scrollTop") == 0  # opened at the prompt's start
    assert page_height_in_screens(page) < 3 and vote_buttons_in_view(page) == []
    page.screenshot(path=str(tmp_path / f"{screen}-huge-prompt-open.png"))

    page.locator("#prompt").evaluate("(box) => box.scrollTop = box.scrollHeight")  # read the prompt to its end
    opened = prompt_text(page)
    page.keyboard.press("3")  # a vote by key goes back to the top as well
    third = wait_for_new_prompt(page, opened)
    page.wait_for_function("() => window.scrollY === 0 && document.getElementById('prompt').scrollTop === 0")
    assert third == "Show me a table and some code."
    page.screenshot(path=str(tmp_path / f"{screen}-table-and-code.png"), full_page=True)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT pair_id, choice FROM votes ORDER BY id").fetchall()[2:] == [(3, "tie")]


def test_tables_and_code_blocks_are_rendered_and_empty_charts_say_no_rounds_yet(browser, screens_app, tmp_path):
    url, _db = screens_app
    page = browser.new_page(viewport=SCREENS["laptop"])
    sign_in(page, url, "alice")
    for _ in range(3):
        before = prompt_text(page)
        page.click("#vote-skip")
        wait_for_new_prompt(page, before)
    answers = page.locator("#answer-left, #answer-right")
    assert answers.locator("table th").all_inner_texts() == ["name", "score"]
    code_background = page.evaluate("() => getComputedStyle(document.querySelector('#answer-left pre, "
                                     "#answer-right pre')).backgroundColor")
    assert code_background not in ("rgba(0, 0, 0, 0)", "transparent")
    page.get_by_role("tab", name="Dashboard").click()
    page.wait_for_function("() => document.querySelector('#dashboard-counts').innerText.includes('Prompts')")
    page.wait_for_selector("text=No rounds yet: each finished round adds a point here.", timeout=10_000)
    page.wait_for_selector("text=No rounds yet: the last round's per-step curves appear here.", timeout=10_000)
    page.screenshot(path=str(tmp_path / "dashboard-no-rounds.png"), full_page=True)
