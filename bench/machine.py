"""What machine a bench ran on, printed with its figures: CPU model and ISA flags, cores, torch, the GPU.

Figures from different machines differ for reasons that are not in the code: an AVX2-only CPU emulates bf16 matmuls
(a PPO step of the default model measured 7x slower in bf16 than in fp32), where a CPU with AVX512-BF16 or AMX, or a
CUDA GPU, does bf16 at full speed. Every bench prints `machine_line(describe_machine())` first and puts
`"machine": describe_machine()` into its last JSON line; benches that take a precision call `check_bf16`.

torch is imported only when asked for (`with_torch`), so a bench that must not load it (bench/first_pair.py) can
describe the CPU too. `peak_rss_mb` is each bench's peak memory figure. The module imports nothing of the repository,
so bench/trl_side.py can use it from TRL's own virtual environment (`from machine import ...`).
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
"""The flags of /proc/cpuinfo that decide how fast matmuls run (x86 `flags`, Arm `Features`), in this order."""
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 flags with bf16 arithmetic: oneDNN runs bf16 matmuls on them; without either it converts to fp32 and back."""
MODEL_KEYS = ("model name", "cpu model", "hardware")
"""Where /proc/cpuinfo names the CPU (x86, MIPS, Arm boards), first found first; x86's `model` is a number."""
EMULATED_SLOWDOWN = "measured 7x slower than fp32 for a PPO step on an AVX2-only CPU"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_cpuinfo(text: str) -> dict:
    """The CPU's model name, its flags among `ISA_FLAGS` (in that order) and its logical cores, from the text of
    /proc/cpuinfo. Pure: tests feed it fixture texts."""
    names, flags, cores = {}, set(), 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "processor" and value.isdigit():
            cores += 1
        elif key in MODEL_KEYS and value:
            names.setdefault(key, value)
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    model = next((names[key] for key in MODEL_KEYS if key in names), "unknown CPU")
    return {"cpu": model, "isa": [flag for flag in ISA_FLAGS if flag in flags], "logical_cores": cores or None}


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux
        return ""


def describe_machine(with_torch: bool = True, cpuinfo: str | None = None) -> dict:
    """The machine as a JSON-ready dict: cpu, isa (flags present), logical_cores, usable_cores (this process's
    affinity), and with torch: torch version, torch_threads, cuda (the device name, None without CUDA), cuda_bf16;
    bf16_native last (see `bf16_native`)."""
    info = parse_cpuinfo(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    info["logical_cores"] = os.cpu_count() or info["logical_cores"]
    info["usable_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else info["logical_cores"]
    if with_torch:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["cuda_bf16"] = bool(info["cuda"]) and _cuda_bf16(torch)
    info["bf16_native"] = bf16_native(info)
    return info


def _cuda_bf16(torch) -> bool:
    """bf16 in the GPU's hardware (Ampere and later); torch's default also counts emulation as support."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # an older torch without the argument
        return bool(torch.cuda.is_bf16_supported())


def bf16_native(info: dict | None = None) -> bool:
    """Whether bf16 matmuls run in hardware where the bench runs: on the CUDA GPU when there is one (its bf16
    support), else on the CPU (AVX512-BF16 or AMX-BF16). Elsewhere torch emulates them, far slower than fp32."""
    info = describe_machine() if info is None else info
    if info.get("cuda"):
        return bool(info.get("cuda_bf16"))
    return any(flag in info.get("isa", ()) for flag in BF16_FLAGS)


def machine_line(info: dict) -> str:
    """One line for a person: `CPU: model, N cores (M usable), flags; bf16 native|emulated; torch V, T threads;
    GPU: name`."""
    cores = f"{info.get('logical_cores')} cores"
    if info.get("usable_cores") not in (None, info.get("logical_cores")):
        cores += f" ({info['usable_cores']} usable)"
    flags = " ".join(info.get("isa") or ["no AVX"])
    parts = [f"CPU: {info.get('cpu')}, {cores}, {flags}",
             f"bf16 {'native' if info.get('bf16_native') else 'emulated'}"]
    if "torch" in info:
        parts.append(f"torch {info['torch']}, {info['torch_threads']} thread{'s' * (info['torch_threads'] != 1)}")
    if info.get("cuda"):
        parts.append(f"GPU: {info['cuda']}{'' if info.get('cuda_bf16') else ' (no bf16)'}")
    return "; ".join(parts)


def emulation_reason(info: dict) -> str:
    """Why bf16 would be emulated on this machine (bf16_native(info) is False)."""
    where = (f"the GPU {info['cuda']} has no bf16 arithmetic" if info.get("cuda") else
             f"the CPU ({info.get('cpu')}) has neither {' nor '.join(BF16_FLAGS)}")
    return f"{where}, so bf16 matmuls are emulated ({EMULATED_SLOWDOWN})"


def check_bf16(requested: bool, allow_emulated: bool, info: dict | None = None, fp32_hint: str = "") -> None:
    """Refuse (SystemExit 2, the reason on stderr) a bf16 run on hardware that would emulate bf16, unless
    `allow_emulated` (--allow-emulated-bf16): then warn on stderr and go on. `fp32_hint` names the bench's own
    option for fp32 (e.g. "--mixed-precision no")."""
    if not requested:
        return
    info = describe_machine() if info is None else info
    if bf16_native(info):
        return
    if allow_emulated:
        print(f"warning: bf16 on emulation (--allow-emulated-bf16): {emulation_reason(info)}; the bf16 figures "
              "measure the emulation.", file=sys.stderr, flush=True)
        return
    instead = f"Run in fp32 ({fp32_hint})" if fp32_hint else "Run in fp32"
    print(f"error: bf16 was requested, but {emulation_reason(info)}: the figures would measure the emulation, not "
          f"the code. {instead}, or pass --allow-emulated-bf16 to measure it anyway.", file=sys.stderr, flush=True)
    raise SystemExit(2)


def add_bf16_flag(parser) -> None:
    """The `--allow-emulated-bf16` option every bench with a precision takes."""
    parser.add_argument("--allow-emulated-bf16", action="store_true",
                        help="run bf16 even where the hardware emulates it (no AVX512-BF16/AMX-BF16 CPU flag, no "
                             "bf16 GPU); refused otherwise, as the figures would measure the emulation")
