"""Per-answer scores of the simulated annotators that are not word lists: structure, examples, register, concision.

Each is a pure function `text -> float`, higher preferred, continuous where it can be (so two real answers seldom
tie), and built from several measures so that no single token moves it far. annotate.simulate turns each into a
judge; docs/annotators.md gives the definitions with their role (tuning or held out) and measured spread.
"""

from __future__ import annotations

import itertools
import re
import statistics

# ---------------------------------------------------------------------------------------------------- structure

_LIST_ITEM = re.compile(r"^(?:[-*+•]\s+\S|\d{1,2}[.)]\s+\S|[a-z][.)]\s+\S|\(\d{1,2}\)\s*\S|step\s+\d+\b)",
                        re.IGNORECASE)
_HEADING = re.compile(r"^(?:#{1,6}\s+\S|\*\*[^*]+\*\*:?\s*$|__[^_]+__:?\s*$)")
_LABEL = re.compile(r"^(?:\*\*)?[A-Z][^.!?:\n]{0,40}:(?:\*\*)?(?:\s|$)")
"""A short lead phrase and a colon opening a line ("Water them properly: ...", "**Tips:**"): a definition-list item or
a heading in plain text."""


def is_structural_line(line: str) -> bool:
    """A list item (`-`, `*`, `+`, `•`, `1.`, `1)`, `a)`, `(1)`, `Step 2`), a markdown heading (`#`, a line that is
    all bold) or a labelled line (a lead phrase of at most 40 characters and a colon)."""
    line = line.strip()
    return bool(_LIST_ITEM.match(line) or _HEADING.match(line) or _LABEL.match(line))


def structure(text: str) -> float:
    """Share of non-empty lines that are list items, headings or labelled lines (0 for a single line: one line is no
    layout), plus 0.2 x min(1, 8 / mean words a chunk), where chunks are lines cut at sentence ends: short, scannable
    chunks. The second term orders the many answers without a list (which would otherwise all tie at 0) by sentence
    length, not by their total length.

    Range 0 to 1.2; 0 for a text without words.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return 0.0
    chunks = [chunk for line in lines for chunk in re.split(r"(?<=[A-Za-z)\"'][.!?])\s+", line) if chunk.split()]
    share = sum(is_structural_line(line) for line in lines) / len(lines) if len(lines) > 1 else 0.0
    return share + 0.2 * min(1.0, 8 / (len(text.split()) / len(chunks)))


# ------------------------------------------------------------------------------------------------------ example

_EXAMPLE_MARKER = re.compile(r"\b(?:for example|for instance|e\.g\.|such as|including|to illustrate|example:|"
                             r"here'?s an example|an example)", re.IGNORECASE)
_QUOTED_SPAN = re.compile(r'"[^"\n]{1,80}"|“[^”\n]{1,80}”|`[^`\n]{1,80}`|\([^()\n]{1,80}\)')
_FENCED_BLOCK = re.compile(r"```.*?```", re.DOTALL)
_LIST_MARKER = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*+•])\s+", re.MULTILINE)
_ANCHOR_WINDOW = 60
"""Characters after an example marker, up to the end of its sentence, in which to look for something concrete."""


def _proper_nouns(text: str) -> int:
    """Capitalised words right after an all-lowercase word on the same line ("like Miracle-Gro", "visit Paris"):
    names in running prose, not sentence starts, lines after a colon or Title Case headings."""
    count = 0
    for line in text.splitlines():
        tokens = [token.strip("()[]\"'*“”") for token in line.split()]
        count += sum(previous.rstrip(",").isalpha() and previous.rstrip(",").islower() and len(word) > 1
                     and word[0].isupper() and word[1:2].islower() for previous, word in itertools.pairwise(tokens))
    return count


def _example_weight(window: str) -> float:
    """1 when a number, a quote, a code span or a name follows the marker in its sentence; 0.5 for an enumeration of
    instances ("such as compost or worm castings"); 0.25 for anything else ("such as the following")."""
    window = re.split(r"[.!?](?:\s|$)|\n", window, maxsplit=1)[0]
    if re.search(r"\d|[\"“`]", window) or re.match(r"[\s,:;(-]*[A-Z][a-z]", window) or _proper_nouns("x " + window):
        return 1.0
    if re.search(r",\s|\s(?:or|and)\s", window):
        return 0.5
    return 0.25


def concreteness(text: str) -> float:
    """Worked examples, then specifics:

    examples = the sum over example markers of their weight (1 when a number, a quoted or code span or a name follows
    in the same sentence within 60 characters; 0.5 for an enumeration, "such as compost or worm castings"; 0.25
    otherwise) + fenced code blocks, at most 3; specifics = (numbers other than list numbering + quoted, code or
    parenthesised spans + names in prose) per word, x 10, at most 1; enumeration = commas per word x 5, at most 1
    (items listed in prose: "snacks, water, non-perishable food"; it orders the many answers with no example).
    Score = examples + specifics + 0.25 x enumeration (0 to 4.25). Markers: for example, for instance, e.g., such
    as, including, to illustrate, "example:", "here's an example", "an example".
    """
    words = text.split()
    if not words:
        return 0.0
    marked = sum(_example_weight(text[marker.end():marker.end() + _ANCHOR_WINDOW])
                 for marker in _EXAMPLE_MARKER.finditer(text))
    examples = min(3.0, marked + len(_FENCED_BLOCK.findall(text)))
    numbers = sum(any(ch.isdigit() for ch in word) for word in _LIST_MARKER.sub("", text).split())
    specifics = numbers + len(_QUOTED_SPAN.findall(text)) + _proper_nouns(text)
    enumeration = min(1.0, 5 * text.count(",") / len(words))
    return examples + min(1.0, 10 * specifics / len(words)) + 0.25 * enumeration


# ------------------------------------------------------------------------------------------------------- formal

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_CONTRACTION = re.compile(r"^(?:[a-z]+n't|[a-z]+'(?:re|ve|ll|d|m)|(?:it|that|there|here|what|let|he|she|who|where|"
                          r"how|i)'s|can't|won't|ain't)$")
SLANG = frozenset([
    "gonna", "wanna", "gotta", "kinda", "sorta", "yeah", "yep", "yup", "nope", "ok", "okay", "hey", "hi", "wow", "oh",
    "lol", "awesome", "cool", "stuff", "super", "totally", "basically", "literally", "actually", "really", "just",
    "pretty", "guys", "folks", "dude"
])
"""Slang and filler: one measure of five, so a formal answer is not one that avoids a word list."""
_SENTENCE_END = re.compile(r"[.!?]+(?:\s+|$)|\n+")


def _sentences(text: str) -> int:
    return max(1, sum(1 for part in _SENTENCE_END.split(text) if _WORD.search(part)))


def formality(text: str) -> float:
    """Formal register:

    min(mean letters a word, 8) / 8 + min(mean words a sentence, 30) / 30
    - 3 x contractions a word - 3 x slang or filler words a word - min(1, exclamation marks a sentence).

    Sentences end at . ! ? or a line break; contractions are n't, 're, 've, 'll, 'd, 'm and it's/that's/let's...
    (not a possessive 's). Roughly -2 to 2; 0 for a text without words.
    """
    words = _WORD.findall(text.replace("’", "'"))
    if not words:
        return 0.0
    lower = [word.lower() for word in words]
    sentences = _sentences(text)
    letters = sum(ch.isalpha() for word in words for ch in word) / len(words)
    contractions = sum(bool(_CONTRACTION.match(word)) for word in lower)
    slang = sum(word in SLANG for word in lower)
    return (min(letters, 8) / 8 + min(len(words) / sentences, 30) / 30
            - 3 * contractions / len(words) - 3 * slang / len(words) - min(1.0, text.count("!") / sentences))


# ------------------------------------------------------------------------------------------------------ concise

STOPWORDS = frozenset([
    "a", "an", "the", "and", "or", "but", "if", "then", "so", "of", "to", "in", "on", "at", "by", "for", "with",
    "from", "as", "into", "about", "over", "under", "is", "are", "was", "were", "be", "been", "being", "am", "do",
    "does", "did", "have", "has", "had", "will", "would", "can", "could", "should", "may", "might", "must", "shall",
    "it", "its", "this", "that", "these", "those", "there", "here", "i", "you", "he", "she", "we", "they", "me",
    "him", "her", "us", "them", "my", "your", "his", "our", "their", "what", "which", "who", "whom", "whose", "when",
    "where", "why", "how", "all", "any", "some", "no", "not", "very", "also", "just", "than", "too", "more", "most",
    "such", "own", "same", "other", "each", "both", "few", "only", "s", "t", "can't", "don't", "it's", "i'm",
    "you're", "that's", "there's", "let's"
])
"""Function words: they carry grammar, not information."""
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def concision(text: str) -> float:
    """Information per word: (distinct content words / words) x min(1, distinct content words / 8) x (1 - share of
    repeated word trigrams).

    Content words are words not in STOPWORDS; the middle factor penalises answers too short to say anything (under 8
    distinct content words), the last one repetition. 0 to 1; 0 for a text without words.
    """
    words = _TOKEN.findall(text.lower().replace("’", "'"))
    if not words:
        return 0.0
    distinct_content = len({word for word in words if word not in STOPWORDS})
    trigrams = list(zip(words, words[1:], words[2:]))
    repeated = 1 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    return distinct_content / len(words) * min(1.0, distinct_content / 8) * (1 - repeated)


# ------------------------------------------------------------------------------------------------------- grading

def score_scale(score, texts: list[str]) -> float:
    """The median absolute score difference over all pairs of `texts` with different scores (0 when none): the
    scale `annotate.simulate.graded` splits "slightly" from "much" better at, so about half the decided pairs of such
    answers are each."""
    values = sorted(score(text) for text in texts)
    gaps = [abs(b - a) for i, a in enumerate(values) for b in values[i + 1:] if b != a]
    return statistics.median(gaps) if gaps else 0.0
