"""Shared fixtures: a tiny random model with the real SmolLM2 tokenizer, so model tests run in seconds."""

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlhf.models import DEFAULT_CACHE_DIR, DEFAULT_GGUF_FILE, DEFAULT_MODEL_NAME, build_tiny_model, default_gguf_dir

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's matmuls are so small that a second OpenMP thread only adds waiting (5-20x slower here).

    Modules that train the tiny model take it with `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def real_tokenizer():
    """The default model's tokenizer: from the converted folder when present, else straight from the GGUF (~4 s)."""
    converted = DEFAULT_CACHE_DIR / DEFAULT_MODEL_NAME
    if (converted / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(converted)
    else:
        tokenizer = AutoTokenizer.from_pretrained(default_gguf_dir(), gguf_file=DEFAULT_GGUF_FILE)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, real_tokenizer) -> Path:
    """A folder holding a tiny random LlamaForCausalLM and the real tokenizer, loadable with from_pretrained."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), real_tokenizer)


@pytest.fixture()
def tokenizer(tiny_model_dir):
    """A fresh left-padding tokenizer for the tiny model (tests may change its settings)."""
    from rlhf.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    """The tiny model with its own random output matrix. With the embeddings tied, a random model's output at a
    position resembles its input token, so greedy decoding repeats the last prompt token ("\\n") whatever the
    prompt; untied, what it writes depends on the whole prompt, which the padding and pair tests need."""
    from rlhf.models import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=generator))
    model.config.tie_word_embeddings = False
    return model


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory, real_tokenizer) -> dict:
    """Folders of tiny random models of every family of rlhf.tiny_models (Llama 3, Qwen2, Gemma 3, Phi-3, Mistral),
    each with the real tokenizer dressed in the family's special tokens and chat template."""
    from rlhf.tiny_models import FAMILIES, build_family_model

    root = tmp_path_factory.mktemp("model-matrix")
    return {name: build_family_model(name, root / name, real_tokenizer) for name in FAMILIES}
