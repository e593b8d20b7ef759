"""Preference pairs for the reward model: reading files, the held-out split, tokenising and batching.

A pair is anything with `prompt`, `chosen` and `rejected` text attributes (the store's `Preference`, or
`PreferencePair` read from a file in TRL's column format), and optionally a `source` (PAIR_SOURCES). Batches
hold the chosen sequences of B pairs followed by their rejected sequences (2B rows, one forward pass),
RIGHT-padded so that the two sequences of a pair line up position by position, as the divergence form of the
pairwise loss needs.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch

from rlhf.generate import pad_sequences
from rlhf.models import format_prompt

REQUIRED_COLUMNS = ("prompt", "chosen", "rejected")
PAIR_SOURCES = ("sample", "versus", "chosen")
"""How a pair came to be voted on: two answers of the policy drawn at random ("sample": what held-out accuracy
estimates the reward model on, the pairs PPO's answers look like), the policy against an earlier one ("versus"), or
two answers picked for the reward model's disagreement ("chosen": harder than average)."""


class PreferenceDataError(ValueError):
    """Preference data that cannot be trained on; the message says what is wrong and how to fix it."""


class PairLike(Protocol):
    """What the trainers take as a preference: the store's `Preference` (the round hands its rows over unchanged) or a
    `PreferencePair`. A `source` (PAIR_SOURCES) and a `strength` (1 to 2) are read where present (`pair_source`,
    `pair_strength`)."""

    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class PreferencePair:
    """One human (or simulated) judgement: for `prompt`, `chosen` was preferred to `rejected`."""

    prompt: str
    chosen: str
    rejected: str
    source: str | None = None
    """One of PAIR_SOURCES; None (a pair read from a file) counts as "sample"."""
    strength: float = 1.0
    """How much better `chosen` is: 1 slightly (also a vote without a grade), 2 much, between for a mean of votes."""

    def __post_init__(self) -> None:
        if self.source is not None and self.source not in PAIR_SOURCES:
            raise ValueError(f"source must be one of {', '.join(PAIR_SOURCES)} or None, not {self.source!r}")
        if not 1.0 <= self.strength <= 2.0:
            raise ValueError(f"strength must be between 1 (slightly better) and 2 (much better), not {self.strength}")


@dataclass(frozen=True)
class TokenizedPair:
    """The token ids of a pair, already truncated: the shared prompt and each answer (ending in EOS)."""

    prompt_ids: list[int]
    chosen_answer_ids: list[int]
    rejected_answer_ids: list[int]

    @property
    def chosen_ids(self) -> list[int]:
        """prompt + chosen answer: the sequence the reward model scores."""
        return self.prompt_ids + self.chosen_answer_ids

    @property
    def rejected_ids(self) -> list[int]:
        """prompt + rejected answer."""
        return self.prompt_ids + self.rejected_answer_ids


def pairs_from_rows(rows: Sequence[dict], source: str) -> list[PreferencePair]:
    """Rows with string columns prompt, chosen, rejected -> pairs; a missing column or a non-string is an error.
    An optional `strength` (what --export writes: 1 slightly to 2 much better) is kept; without one a pair is 1."""
    pairs = []
    for index, row in enumerate(rows):
        missing = [column for column in REQUIRED_COLUMNS if column not in row]
        if missing:
            raise PreferenceDataError(
                f"{source}: row {index + 1} has no column {', '.join(repr(c) for c in missing)}; preference data "
                f"needs the columns prompt, chosen, rejected (TRL's format). Columns found: {sorted(row)}"
            )
        bad = [column for column in REQUIRED_COLUMNS if not isinstance(row[column], str)]
        if bad:
            raise PreferenceDataError(
                f"{source}: row {index + 1}: column {bad[0]!r} must be text, got {type(row[bad[0]]).__name__}. "
                "Conversational (list of messages) columns are not supported; flatten them to text."
            )
        strength = row.get("strength")
        if strength is None:
            strength = 1.0
        elif isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 1 <= strength <= 2:
            raise PreferenceDataError(f"{source}: row {index + 1}: strength must be a number from 1 (slightly better) "
                                      f"to 2 (much better), got {strength!r}")
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"], strength=float(strength)))
    return pairs


def load_preference_file(path: str | os.PathLike) -> list[PreferencePair]:
    """Read pairs from a JSONL file, a Parquet/CSV/JSON file, or a local Hugging Face dataset folder."""
    path = Path(path)
    if not path.exists():
        raise PreferenceDataError(f"{path} does not exist; pass a JSONL file or a dataset folder with --data.")
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        return pairs_from_rows(_read_json_lines(path), str(path))
    import datasets  # slow to import; only when a dataset is really read

    try:
        if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            dataset = datasets.load_from_disk(str(path))
        elif path.is_dir():
            dataset = datasets.load_dataset(str(path))
        else:
            file_type = {".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
            if file_type is None:
                raise PreferenceDataError(
                    f"{path}: unknown file type {path.suffix!r}; use .jsonl, .json, .parquet, .csv or a dataset folder."
                )
            dataset = datasets.load_dataset(file_type, data_files=str(path))
    except PreferenceDataError:
        raise
    except Exception as error:  # datasets raises many types for unreadable folders
        raise PreferenceDataError(f"{path}: could not read it as a dataset ({error}).") from error
    if isinstance(dataset, datasets.DatasetDict):
        split = "train" if "train" in dataset else next(iter(dataset))
        dataset = dataset[split]
    missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
    if missing:
        raise PreferenceDataError(
            f"{path}: no column {', '.join(repr(c) for c in missing)}; preference data needs the columns prompt, "
            f"chosen, rejected (TRL's format). Columns found: {dataset.column_names}"
        )
    columns = [*REQUIRED_COLUMNS, *(["strength"] if "strength" in dataset.column_names else [])]
    return pairs_from_rows(dataset.select_columns(columns).to_list(), str(path))


def _read_json_lines(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise PreferenceDataError(f"{path}:{line_number}: not valid JSON ({error.msg}).") from error
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PreferenceDataError(f"{path}: row {index + 1} is not a JSON object with prompt, chosen, rejected.")
    return rows


def prompt_position(prompt: str) -> float:
    """The prompt's place in [0, 1): the first 8 bytes of sha256 of its UTF-8 text over 2**64. The same in every
    round, process and machine, with nothing stored."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_pairs(pairs: Sequence[PairLike], heldout_fraction: float) -> tuple[list[PairLike], list[PairLike]]:
    """(train, heldout) by prompt: the pairs of a prompt whose `prompt_position` is below heldout_fraction are
    held out, every other pair trains; each side keeps the order of `pairs`.

    No prompt is on both sides, and a pair held out once is held out in every later round, whatever else has been
    voted on since (the reward model of the "full" strategy continues from the last round's: a pair it trained on
    must never measure it). About heldout_fraction of the prompts are held out, so few prompts may hold out none
    (the caller reports n_heldout 0 and no accuracy). When every prompt falls below the fraction (a handful of
    prompts), the one placed highest trains, so that there is something to train on.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise PreferenceDataError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}.")
    positions = {pair.prompt: prompt_position(pair.prompt) for pair in pairs}
    heldout_prompts = {prompt for prompt, position in positions.items() if position < heldout_fraction}
    if heldout_prompts and len(heldout_prompts) == len(positions):
        heldout_prompts.discard(max(positions, key=positions.get))
    train = [pair for pair in pairs if pair.prompt not in heldout_prompts]
    heldout = [pair for pair in pairs if pair.prompt in heldout_prompts]
    return train, heldout


def pair_weights(pairs: Sequence[PairLike]) -> torch.Tensor:
    """(N,) float64: each pair's weight in the loss (the store's Preference.weight under votes.weighting =
    "reliability"); 1 for a pair without one (a file's pairs, majority labels)."""
    return torch.tensor([1.0 if getattr(p, "weight", None) is None else float(p.weight) for p in pairs],
                        dtype=torch.float64)


def pair_strength(pair: PairLike) -> float:
    """The pair's strength (PreferencePair.strength); a pair without one counts as slightly better (1)."""
    return float(getattr(pair, "strength", None) or 1.0)


def pair_source(pair: PairLike) -> str:
    """The pair's source (PAIR_SOURCES); a pair without one (read from a file) counts as a random sample pair."""
    return getattr(pair, "source", None) or "sample"


def heldout_accuracies(pairs: Sequence[PairLike], correct: Sequence[bool]) -> dict:
    """Held-out accuracy by source, from whether the model ranked each held-out pair right.

    rm/heldout_accuracy is over the random sample pairs (the estimate of how well the model ranks what the policy
    writes, which the round's refusal reads), rm/heldout_accuracy_versus and rm/heldout_accuracy_chosen over the
    others; rm/n_heldout counts them all and rm/n_heldout_<source> each. An accuracy over no pairs is None.
    """
    if len(pairs) != len(correct):
        raise ValueError(f"{len(correct)} results for {len(pairs)} held-out pairs")
    metrics: dict = {"rm/n_heldout": len(pairs)}
    for source in PAIR_SOURCES:
        right = [bool(ok) for pair, ok in zip(pairs, correct) if pair_source(pair) == source]
        name = "rm/heldout_accuracy" if source == "sample" else f"rm/heldout_accuracy_{source}"
        metrics[name] = sum(right) / len(right) if right else None
        metrics[f"rm/n_heldout_{source}"] = len(right)
    return metrics


def truncate_pair(
    prompt_ids: list[int], chosen_ids: list[int], rejected_ids: list[int], max_length: int
) -> TokenizedPair:
    """prompt + answer for both answers, each at most max_length tokens, both cut the same way.

    Answers keep their end (the EOS, where the score is read): the prompt is cut from the left first,
    by the same amount for both answers so that they still line up position by position. Only when an
    answer alone leaves less than half of max_length for the prompt is that answer cut from its start too.
    """
    longest_answer = max(len(chosen_ids), len(rejected_ids))
    prompt_room = max(max_length - longest_answer, min(len(prompt_ids), max_length // 2))
    kept_prompt = prompt_ids[max(0, len(prompt_ids) - prompt_room):]
    answer_room = max_length - len(kept_prompt)
    return TokenizedPair(
        prompt_ids=kept_prompt,
        chosen_answer_ids=chosen_ids[max(0, len(chosen_ids) - answer_room):],
        rejected_answer_ids=rejected_ids[max(0, len(rejected_ids) - answer_room):],
    )


def tokenize_pairs(tokenizer, pairs: Sequence[PairLike], max_length: int) -> list[TokenizedPair]:
    """Each pair as token ids: format_prompt(prompt) then answer then EOS, truncated by `truncate_pair`.

    Prompt and answer are tokenised separately, as generation produces them (the prompt's ids, then the
    sampled answer's), so the reward model sees during training what PPO will hand it.
    """
    if max_length < 4:
        raise PreferenceDataError(f"max_length must be at least 4 tokens, got {max_length}.")
    if not pairs:
        return []
    eos = tokenizer.eos_token_id
    # a chat template writes its own special tokens; plain prompts get what the tokenizer adds by default
    add_special = not getattr(tokenizer, "chat_template", None)
    prompts = [format_prompt(tokenizer, pair.prompt) for pair in pairs]
    prompt_ids = tokenizer(prompts, add_special_tokens=add_special)["input_ids"]
    chosen_ids = tokenizer([pair.chosen for pair in pairs], add_special_tokens=False)["input_ids"]
    rejected_ids = tokenizer([pair.rejected for pair in pairs], add_special_tokens=False)["input_ids"]

    def with_eos(ids: list[int]) -> list[int]:
        return ids if ids and ids[-1] == eos else ids + [eos]

    return [
        truncate_pair(p, with_eos(c), with_eos(r), max_length)
        for p, c, r in zip(prompt_ids, chosen_ids, rejected_ids)
    ]


PAIR_ANSWERS = ("chosen", "rejected")
"""The answers of a pair, in the order of a batch's rows."""


def pad_pair_rows(pairs: Sequence[TokenizedPair], pad_id: int, side: str = "right",
                  answers: Sequence[str] = PAIR_ANSWERS,
                  with_prompt: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, answer_mask), each (len(answers) * B, L), padded on `side`: one row per pair for
    each of `answers` in turn (by default rows [0, B) the chosen sequences, rows [B, 2B) the rejected ones), each
    row the prompt then that answer, or the answer alone without `with_prompt`. answer_mask is 1 on each row's
    answer tokens (EOS included), what a mean-pooled score averages over.

    The one place where tokenised pairs become padded tensors: training batches (`PairCollator`), LP-FT's batches
    and the scoring of single answers (`rlhf.reward.strategies.pad_answers`, a pair whose chosen answer is scored).
    """
    unknown = [answer for answer in answers if answer not in PAIR_ANSWERS]
    if unknown:
        raise ValueError(f"answers must be among {', '.join(PAIR_ANSWERS)}, not {unknown[0]!r}")
    rows, answer_flags = [], []
    for answer in answers:
        for pair in pairs:
            prompt_ids = pair.prompt_ids if with_prompt else []
            answer_ids = pair.chosen_answer_ids if answer == "chosen" else pair.rejected_answer_ids
            rows.append(prompt_ids + answer_ids)
            answer_flags.append([0] * len(prompt_ids) + [1] * len(answer_ids))
    ids, attention_mask = pad_sequences(rows, pad_id, side)  # (kB, L) each
    return ids, attention_mask, pad_sequences(answer_flags, 0, side)[0]  # answer_mask (kB, L)


class PairCollator:
    """collate_fn over `TokenizedPair`s: B pairs -> a dict of tensors for `RewardModel.forward(**batch)`.

    Always "input_ids" and "attention_mask", (2B, L), RIGHT-padded: rows [0, B) chosen, rows [B, 2B)
    rejected. Without `share_prompt` the rows are whole sequences (prompt + answer). With it they are the
    answers only, and "prompt_ids"/"prompt_mask" (B, P), LEFT-padded, hold each pair's prompt once, so the
    backbone reads every prompt once instead of twice; the loss sees the same answer positions either way.
    """

    def __init__(self, pad_token_id: int, share_prompt: bool = False):
        self.pad_token_id = pad_token_id
        self.share_prompt = share_prompt

    def __call__(self, pairs: Sequence[TokenizedPair]) -> dict[str, torch.Tensor]:
        # (2B, L) each: whole sequences, or with a shared prompt the answers alone
        input_ids, attention_mask, _ = pad_pair_rows(pairs, self.pad_token_id, with_prompt=not self.share_prompt)
        if not self.share_prompt:
            return {"input_ids": input_ids, "attention_mask": attention_mask}
        prompts = [pair.prompt_ids for pair in pairs]
        prompt_ids, prompt_mask = pad_sequences(prompts, self.pad_token_id, side="left")  # (B, P), (B, P)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask}
