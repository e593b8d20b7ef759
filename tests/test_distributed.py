"""make_accelerator's precision choice: auto is bf16 exactly where the hardware does bf16 arithmetic."""

from __future__ import annotations

import pytest
import torch

from rlhf import distributed
from rlhf.models import default_dtype


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(True, False, True), (False, True, True),
                                                         (False, False, False)])
def test_native_bf16_on_a_cpu_follows_its_instruction_set(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(distributed, "has_accelerator", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert distributed.native_bf16() is expected
    # a model that is only sampled from loads in bf16 exactly there
    assert default_dtype("cpu") == (torch.bfloat16 if expected else torch.float32)


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "no")])
def test_auto_precision_is_bf16_only_with_native_bf16(monkeypatch, native, expected):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(distributed, "native_bf16", lambda: native)
    assert distributed.make_accelerator("auto").mixed_precision == expected
    assert distributed.make_accelerator("no").mixed_precision == "no"  # an explicit choice is kept


def test_accelerate_launch_precision_wins_over_auto(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setattr(distributed, "native_bf16", lambda: True)
    assert distributed.make_accelerator("auto").mixed_precision == "no"
