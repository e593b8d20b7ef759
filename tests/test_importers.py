"""Prompt import: every supported format, every kind of bad input, and all-or-nothing writes."""

import json

import pytest

from annotate.importers import PromptImportError, read_prompts
from annotate.records import ImportResult
from annotate.store import Store


@pytest.fixture
def store():
    with Store(":memory:") as s:
        yield s


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_with_prompt_or_text_fields_skipping_blank_lines(tmp_path):
    path = write(tmp_path / "p.jsonl", '{"prompt": " Say hi. "}\n\n{"text": "Name a colour.", "id": 7}\n')
    assert read_prompts(path) == ["Say hi.", "Name a colour."]


def test_json_array_of_objects_or_strings(tmp_path):
    path = write(tmp_path / "p.json", json.dumps([{"prompt": "One"}, "Two", {"text": "Three"}]))
    assert read_prompts(path) == ["One", "Two", "Three"]


def test_json_file_holding_json_lines(tmp_path):
    assert read_prompts(write(tmp_path / "p.json", '{"prompt": "One"}\n{"prompt": "Two"}\n')) == ["One", "Two"]


def test_csv_with_prompt_column_and_quoted_cells(tmp_path):
    path = write(tmp_path / "p.csv", 'id,prompt\n1,"Hello, world"\n2,"Two\nlines"\n\n3,Plain\n')
    assert read_prompts(path) == ["Hello, world", "Two\nlines", "Plain"]


def test_tsv_with_text_column(tmp_path):
    assert read_prompts(write(tmp_path / "p.tsv", "text\tother\nFirst\tx\nSecond\ty\n")) == ["First", "Second"]


def test_plain_text_one_prompt_per_line_with_a_bom(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("\ufeffFirst line\r\n\r\n  Second line  \nThird".encode("utf-8"))
    assert read_prompts(path) == ["First line", "Second line", "Third"]


def test_hugging_face_dataset_saved_to_disk(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["t1", "t2"], "n": [1, 2]}).save_to_disk(str(tmp_path / "ds"))
    assert read_prompts(tmp_path / "ds") == ["t1", "t2"]


def test_hugging_face_dataset_dict_saved_to_disk_reads_every_split(tmp_path):
    import datasets

    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"prompt": ["p1", "p2"]}),
        "test": datasets.Dataset.from_dict({"prompt": ["p3"]}),
    }).save_to_disk(str(tmp_path / "dsd"))
    assert read_prompts(tmp_path / "dsd") == ["p1", "p2", "p3"]


def test_folder_of_data_files_loads_through_datasets(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    write(folder / "train.jsonl", '{"prompt": "x1"}\n{"prompt": "x2"}\n')
    assert read_prompts(folder) == ["x1", "x2"]


def test_parquet_file(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"prompt": ["q1", "q2"]}).to_parquet(str(tmp_path / "p.parquet"))
    assert read_prompts(tmp_path / "p.parquet") == ["q1", "q2"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": "broken"\n', r"bad\.jsonl, line 2: malformed JSON"),
        ("missing.jsonl", '{"prompt": "ok"}\n\n{"question": "no"}\n', r"missing\.jsonl, line 3: missing field 'prompt' or 'text' \(fields: question\)"),
        ("number.jsonl", '{"prompt": 5}\n', r"number\.jsonl, line 1: field 'prompt' is int, not text"),
        ("list.jsonl", '["a"]\n', r"list\.jsonl, line 1: expected an object"),
        ("blank.jsonl", '{"prompt": "ok"}\n{"prompt": "  "}\n', r"blank\.jsonl, line 2: empty prompt"),
        ("empty.jsonl", "", r"empty\.jsonl: empty file: no prompts found"),
        ("spaces.txt", "\n  \n\n", r"spaces\.txt: empty file: no prompts found"),
        ("empty.csv", "", r"empty\.csv: empty file: no header row"),
        ("nocol.csv", "id,question\n1,hi\n", r"nocol\.csv, line 1: missing column 'prompt' or 'text' \(columns: id, question\)"),
        ("cell.csv", "id,prompt\n1,hi\n2,\n", r"cell\.csv, line 3: empty 'prompt' cell"),
        ("headonly.csv", "prompt\n", r"headonly\.csv: empty file: no prompts found"),
        ("array.json", '[{"prompt": "a"}, {"q": "b"}]', r"array\.json: item 2: missing field"),
        ("object.json", '{"prompts": []}', r"object\.json, line 1: missing field"),
        ("doc.docx", "anything", r"doc\.docx: unsupported file type '\.docx'"),
    ],
)
def test_bad_input_names_the_file_and_line(tmp_path, name, content, message):
    with pytest.raises(PromptImportError, match=message):
        read_prompts(write(tmp_path / name, content))


def test_non_utf8_input_names_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("first\nsecond\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(PromptImportError, match=r"latin1\.txt, line 3: not UTF-8 text") as caught:
        read_prompts(path)
    assert (caught.value.path, caught.value.line) == (str(path), 3)
    assert isinstance(caught.value, ValueError)


def test_a_program_is_an_unsupported_file_type_not_bad_text_and_the_message_lists_the_formats(tmp_path):
    path = tmp_path / "upload-7f3a" / "setup.exe"
    path.parent.mkdir()
    path.write_bytes(b"MZ\x90\x00\xff\xfe binary")
    with pytest.raises(PromptImportError) as caught:
        read_prompts(path)
    assert caught.value.reason == (
        "unsupported file type '.exe'; accepted: JSON Lines (.jsonl), JSON (.json), CSV (.csv), TSV (.tsv), plain text "
        "with one prompt a line (.txt), Parquet (.parquet) or Arrow (.arrow), or a Hugging Face dataset folder")
    assert str(caught.value) == f"{path}: {caught.value.reason}"
    assert caught.value.naming("setup.exe") == f"setup.exe: {caught.value.reason}"  # as the person named it


def test_missing_file_and_bad_dataset_folder(tmp_path):
    with pytest.raises(PromptImportError, match="no such file or folder"):
        read_prompts(tmp_path / "nope.jsonl")
    import datasets

    datasets.Dataset.from_dict({"question": ["q"]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(PromptImportError, match=r"ds: missing column 'prompt' or 'text' \(columns: question\)"):
        read_prompts(tmp_path / "ds")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(PromptImportError, match="emptydir: not a readable Hugging Face dataset folder"):
        read_prompts(tmp_path / "emptydir")


def test_store_import_counts_added_and_skipped_with_the_file_name_as_source(store, tmp_path):
    store.add_prompts(["Say hi."])
    path = write(tmp_path / "mine.jsonl", '{"prompt": "Say hi."}\n{"prompt": "New one"}\n{"prompt": "New one"}\n')
    assert store.import_prompts(path) == ImportResult(added=1, skipped=2)
    assert [(p.text, p.source) for p in store.prompts()] == [("Say hi.", ""), ("New one", "mine.jsonl")]


def test_a_failed_import_writes_nothing(store, tmp_path):
    path = write(tmp_path / "half.jsonl", '{"prompt": "fine 1"}\n{"prompt": "fine 2"}\nnot json\n')
    with pytest.raises(PromptImportError, match="line 3"):
        store.import_prompts(path)
    assert store.count_prompts() == 0


def test_the_shipped_prompts_import_cleanly(store):
    result = store.import_prompts("data/prompts.jsonl")
    assert result.added >= 200 and result.skipped == 0
