"""Prompt file readers: JSONL/JSON, CSV/TSV, plain text and local Hugging Face dataset folders -> list[str].

Readers only read: they return every prompt or raise `PromptImportError`, so the store can write all-or-nothing.
A prompt over the length limit or holding control characters (annotate.text_limits) is an error of its file.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from annotate.text_limits import MAX_PROMPT_CHARS, prompt_problem

PROMPT_FIELDS = ("prompt", "text")
"""Field (or column) names holding the prompt, in order of preference."""
TEXT_SUFFIXES = {"", ".txt", ".text"}
DATA_FILE_SUFFIXES = {".parquet", ".arrow"}
SUFFIXES = {".jsonl", ".json", ".csv", ".tsv", *TEXT_SUFFIXES, *DATA_FILE_SUFFIXES}
ACCEPTED_FILES = ("JSON Lines (.jsonl), JSON (.json), CSV (.csv), TSV (.tsv), plain text with one prompt a line "
                  "(.txt), Parquet (.parquet) or Arrow (.arrow)")
"""For messages: the files read_prompts accepts, each with a 'prompt' or 'text' field or column (text: none)."""
ACCEPTED_FORMATS = f"{ACCEPTED_FILES}, or a Hugging Face dataset folder"
CSV_FIELD_LIMIT = 2**31 - 1
"""csv's cell limit while reading prompts: none in effect (the largest a C long holds everywhere)."""


class PromptImportError(ValueError):
    """A prompt file could not be read; the message names the file and, where it applies, the line."""

    def __init__(self, path: Path | str, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.reason = message
        """What is wrong, without the file's name."""
        super().__init__(self.naming(self.path))

    def naming(self, name: str) -> str:
        """The message with the file called `name`: the name a person uploaded, not the server's copy of it."""
        where = f"{name}, line {self.line}" if self.line is not None else name
        return f"{where}: {self.reason}"


def _decoded_lines(path: Path) -> list[str]:
    """The file's lines, decoded as UTF-8 (a BOM is dropped); a bad byte is reported with its line number."""
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = []
    for number, raw_line in enumerate(raw.split(b"\n"), start=1):
        try:
            lines.append(raw_line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as error:
            raise PromptImportError(path, f"not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8 "
                                          f"text, or use one of: {ACCEPTED_FORMATS}", number) from None
    return lines


def _accepted(path: Path, text: str, line: int | None, max_chars: int) -> str:
    """The prompt, stripped, or PromptImportError when it is too long or holds control characters."""
    if problem := prompt_problem(text, max_chars):
        raise PromptImportError(path, problem, line)
    return text.strip()


def _prompt_from_record(path: Path, record: object, line: int | None, max_chars: int) -> str:
    if isinstance(record, str):
        text = record
    elif isinstance(record, dict):
        field = next((name for name in PROMPT_FIELDS if name in record), None)
        if field is None:
            keys = ", ".join(sorted(map(str, record))) or "none"
            raise PromptImportError(path, f"missing field 'prompt' or 'text' (fields: {keys})", line)
        text = record[field]
        if not isinstance(text, str):
            raise PromptImportError(path, f"field '{field}' is {type(text).__name__}, not text", line)
    else:
        raise PromptImportError(path, f"expected an object with a 'prompt' field, got {type(record).__name__}", line)
    if not text.strip():
        raise PromptImportError(path, "empty prompt", line)
    return _accepted(path, text, line, max_chars)


def _read_jsonl(path: Path, lines: list[str], max_chars: int) -> list[str]:
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptImportError(path, f"malformed JSON ({error.msg} at column {error.colno})", number) from None
        prompts.append(_prompt_from_record(path, record, number, max_chars))
    return prompts


def _read_json_array(path: Path, lines: list[str], max_chars: int) -> list[str]:
    try:
        records = json.loads("\n".join(lines))
    except json.JSONDecodeError as error:
        raise PromptImportError(path, f"malformed JSON ({error.msg} at column {error.colno})", error.lineno) from None
    if not isinstance(records, list):
        raise PromptImportError(path, "a .json file must hold a list of prompts or objects (or be JSON Lines)")
    # Which line an element came from is lost once parsed: report its position in the list instead.
    prompts = []
    for index, record in enumerate(records, start=1):
        try:
            prompts.append(_prompt_from_record(path, record, None, max_chars))
        except PromptImportError as error:
            raise PromptImportError(path, f"item {index}: {error.reason}") from None
    return prompts


def _read_csv(path: Path, lines: list[str], delimiter: str, max_chars: int) -> list[str]:
    # csv refuses a cell over 128 KiB as "field larger than field limit", naming neither the length nor the setting;
    # the whole file is in memory already, so lift that limit (for the process: it only ever refuses) and let
    # max_chars speak.
    csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.DictReader(io.StringIO("\n".join(lines)), delimiter=delimiter)
    try:
        header = reader.fieldnames
    except csv.Error as error:
        raise PromptImportError(path, f"malformed CSV ({error})", 1) from None
    if not header:
        raise PromptImportError(path, "empty file: no header row")
    column = next((name for name in PROMPT_FIELDS if name in header), None)
    if column is None:
        raise PromptImportError(path, f"missing column 'prompt' or 'text' (columns: {', '.join(header)})", 1)
    prompts = []
    try:
        for row in reader:
            text = row.get(column)
            if text is None or not text.strip():
                if not any((value or "").strip() for value in row.values() if isinstance(value, str)):
                    continue  # a blank line
                raise PromptImportError(path, f"empty '{column}' cell", reader.line_num)
            prompts.append(_accepted(path, text, reader.line_num, max_chars))
    except csv.Error as error:
        raise PromptImportError(path, f"malformed CSV ({error})", reader.line_num) from None
    return prompts


def _read_text(path: Path, lines: list[str], max_chars: int) -> list[str]:
    """One prompt a line; blank lines are skipped."""
    return [_accepted(path, line, number, max_chars) for number, line in enumerate(lines, start=1) if line.strip()]


def _read_dataset_folder(path: Path, max_chars: int) -> list[str]:
    import datasets

    try:
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(str(path))
    except Exception as error:  # datasets raises many types; the user needs the file and the reason
        raise PromptImportError(path, f"not a readable Hugging Face dataset folder ({error})") from None
    return _prompts_from_dataset(path, loaded, max_chars)


def _read_data_file(path: Path, max_chars: int) -> list[str]:
    import datasets

    try:
        read = datasets.Dataset.from_parquet if path.suffix == ".parquet" else datasets.Dataset.from_file
        loaded = read(str(path))
    except Exception as error:
        raise PromptImportError(path, f"not a readable {path.suffix} file ({error})") from None
    return _prompts_from_dataset(path, loaded, max_chars)


def _prompts_from_dataset(path: Path, loaded, max_chars: int) -> list[str]:
    """Every split in order (a DatasetDict's splits one after the other)."""
    import datasets

    splits = list(loaded.values()) if isinstance(loaded, (datasets.DatasetDict, dict)) else [loaded]
    prompts = []
    for split in splits:
        column = next((name for name in PROMPT_FIELDS if name in split.column_names), None)
        if column is None:
            columns = ", ".join(split.column_names)
            raise PromptImportError(path, f"missing column 'prompt' or 'text' (columns: {columns})")
        for row_number, text in enumerate(split[column], start=1):
            if not isinstance(text, str) or not text.strip():
                raise PromptImportError(path, f"row {row_number}: empty or non-text '{column}'")
            if problem := prompt_problem(text, max_chars):
                raise PromptImportError(path, f"row {row_number}: {problem}")
            prompts.append(text.strip())
    return prompts


def read_prompts(path: Path | str, max_prompt_chars: int = MAX_PROMPT_CHARS) -> list[str]:
    """Read every prompt from a file or dataset folder, stripped; raise PromptImportError naming file and line.

    A prompt over `max_prompt_chars` characters, or holding control characters other than line breaks and tabs, is
    such an error too."""
    path = Path(path)
    if not path.exists():
        raise PromptImportError(path, "no such file or folder")
    suffix = path.suffix.lower()
    if path.is_dir():
        prompts = _read_dataset_folder(path, max_prompt_chars)
    elif suffix not in SUFFIXES:  # before reading: a program or a picture is not "bad UTF-8"
        raise PromptImportError(path, f"unsupported file type '{suffix}'; accepted: {ACCEPTED_FORMATS}")
    elif suffix in DATA_FILE_SUFFIXES:
        prompts = _read_data_file(path, max_prompt_chars)
    else:
        lines = _decoded_lines(path)
        if suffix == ".jsonl":
            prompts = _read_jsonl(path, lines, max_prompt_chars)
        elif suffix == ".json":
            json_array = "\n".join(lines).lstrip()[:1] == "["
            prompts = (_read_json_array if json_array else _read_jsonl)(path, lines, max_prompt_chars)
        elif suffix in (".csv", ".tsv"):
            prompts = _read_csv(path, lines, "\t" if suffix == ".tsv" else ",", max_prompt_chars)
        else:
            prompts = _read_text(path, lines, max_prompt_chars)
    if not prompts:
        raise PromptImportError(path, "empty file: no prompts found")
    return prompts
