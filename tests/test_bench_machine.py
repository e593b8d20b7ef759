"""bench/machine.py (what a bench ran on, bf16 refused where it is emulated) and bench/generate.py's arithmetic."""

import json

import pytest

from bench.generate import cell_figures, headline, summarize, table_row
from bench.machine import bf16_native, check_bf16, machine_line, parse_cpuinfo


def cpuinfo(model: str, flags: str, cores: int = 2, model_number: int = 49) -> str:
    """/proc/cpuinfo of an x86 machine, as Linux writes it (the numeric `model` line comes before `model name`)."""
    block = (f"processor\t: {{n}}\nvendor_id\t: X\ncpu family\t: 23\nmodel\t\t: {model_number}\n"
             f"model name\t: {model}\nstepping\t: 0\ncpu MHz\t\t: 2450.000\nflags\t\t: {flags}\n\n")
    return "".join(block.format(n=n) for n in range(cores))


BASE = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx"
AVX2_ONLY = cpuinfo("AMD EPYC 7B12", f"{BASE} pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx "
                                     "f16c rdrand hypervisor lahf_lm bmi1 avx2 smep bmi2 rdseed adx clflushopt sha_ni")
EPYC_BF16 = cpuinfo("AMD EPYC 9B14", f"{BASE} pni ssse3 fma sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw "
                                     "avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg", cores=4,
                    model_number=17)
AMX_XEON = cpuinfo("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                   f"{BASE} pni ssse3 fma sse4_2 avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx_vnni "
                   "avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8", cores=8, model_number=143)


def test_the_cpuinfo_parser_reads_the_model_the_isa_flags_and_the_cores():
    assert parse_cpuinfo(AVX2_ONLY) == {"cpu": "AMD EPYC 7B12", "isa": ["avx", "avx2", "fma", "f16c"],
                                        "logical_cores": 2}
    assert parse_cpuinfo(EPYC_BF16) == {
        "cpu": "AMD EPYC 9B14", "isa": ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                        "avx512_bf16"], "logical_cores": 4}
    assert parse_cpuinfo(AMX_XEON) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
        "isa": ["avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"], "logical_cores": 8}
    assert parse_cpuinfo("") == {"cpu": "unknown CPU", "isa": [], "logical_cores": None}


def test_bf16_is_native_on_a_cpu_with_avx512_bf16_or_amx_and_on_a_gpu_that_has_it():
    assert not bf16_native(parse_cpuinfo(AVX2_ONLY))
    assert bf16_native(parse_cpuinfo(EPYC_BF16))
    assert bf16_native(parse_cpuinfo(AMX_XEON))
    assert bf16_native({**parse_cpuinfo(AVX2_ONLY), "cuda": "NVIDIA H100", "cuda_bf16": True})
    # on a GPU machine the GPU decides: a V100 emulates bf16 whatever the CPU has
    assert not bf16_native({**parse_cpuinfo(AMX_XEON), "cuda": "Tesla V100", "cuda_bf16": False})


def test_describe_machine_without_torch_reads_the_given_cpuinfo():
    from bench.machine import describe_machine

    info = describe_machine(with_torch=False, cpuinfo=AVX2_ONLY)
    assert info["cpu"] == "AMD EPYC 7B12" and info["bf16_native"] is False and "torch" not in info
    assert info["logical_cores"] >= 1 and json.loads(json.dumps(info)) == info


def test_the_machine_line_names_the_cpu_its_flags_bf16_torch_and_the_gpu():
    info = {**parse_cpuinfo(AVX2_ONLY), "usable_cores": 1, "torch": "2.13.0", "torch_threads": 1, "cuda": None,
            "bf16_native": False}
    assert machine_line(info) == ("CPU: AMD EPYC 7B12, 2 cores (1 usable), avx avx2 fma f16c; bf16 emulated; "
                                  "torch 2.13.0, 1 thread")
    gpu = {**info, "usable_cores": 2, "cuda": "NVIDIA H200", "cuda_bf16": True, "bf16_native": True, "torch_threads": 4}
    assert machine_line(gpu).endswith("bf16 native; torch 2.13.0, 4 threads; GPU: NVIDIA H200")


def test_bf16_on_emulating_hardware_is_refused_with_the_flag_that_allows_it(capsys):
    with pytest.raises(SystemExit) as stopped:
        check_bf16(True, allow_emulated=False, info=parse_cpuinfo(AVX2_ONLY), fp32_hint="--mixed-precision no")
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "--allow-emulated-bf16" in message and "--mixed-precision no" in message
    assert "AMD EPYC 7B12" in message and "avx512_bf16" in message and "emulated" in message


def test_bf16_on_emulating_hardware_runs_with_a_warning_when_allowed(capsys):
    check_bf16(True, allow_emulated=True, info=parse_cpuinfo(AVX2_ONLY))
    assert capsys.readouterr().err.startswith("warning: bf16 on emulation")


def test_no_word_when_bf16_is_native_or_not_asked_for(capsys):
    check_bf16(True, allow_emulated=False, info=parse_cpuinfo(AMX_XEON))
    check_bf16(False, allow_emulated=False, info=parse_cpuinfo(AVX2_ONLY))
    assert capsys.readouterr() == ("", "")


def test_the_generate_bench_computes_tokens_per_second_and_the_speedup_from_its_figures():
    cell = cell_figures(16, 64, "fp32", ours=(1024, 4.0), plain=(1000, 20.0))
    assert (cell["ours_tokens_per_s"], cell["plain_tokens_per_s"], cell["speedup"]) == (256.0, 50.0, 5.12)
    assert table_row(cell) == "   16      64  fp32       256.0         50.0     5.12x"
    cells = [cell, cell_figures(16, 64, "bf16", (1024, 2.0), (1024, 8.0)), cell_figures(8, 64, "bf16", (1, 1), (1, 2))]
    summary = summarize(cells, {"cpu": "x"}, "bf16", {"threads": 1}, [])
    assert (summary["speedup_b16_t64"], summary["speedup_b16_t64_dtype"]) == (4.0, "bf16")
    assert summary["machine"] == {"cpu": "x"} and summary["cells"] == cells
    assert headline(cells[:1], "bf16") == (5.12, "fp32")  # the default precision not measured: the fp32 cell
    assert headline(cells[2:], "fp32") == (None, None)


def test_the_generate_bench_runs_on_a_tiny_model(tiny_model_dir, capsys):
    import torch

    from bench.generate import main as generate_bench

    threads = torch.get_num_threads()
    try:
        summary = generate_bench(["--model", str(tiny_model_dir), "--batch-sizes", "4", "--new-tokens", "4",
                                  "--dtypes", "fp32", "--per-prompt", "2", "--ppo"])
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("CPU: ") and json.loads(lines[-1]) == summary
    (cell,) = summary["cells"]
    assert (cell["batch_size"], cell["new_tokens"], cell["dtype"]) == (4, 4, "fp32")
    # 4 rows either way (2 prompts x 2 answers ours, the 4 repeated rows plain), 1 to 4 tokens each
    assert 4 <= cell["ours_tokens"] <= 16 and 4 <= cell["plain_tokens"] <= 16 and cell["speedup"] > 0
    rollout = summary["ppo_generate"]  # PPO's phase 1: batch 8, up to 48 tokens
    assert rollout["phase"] == "ppo generate" and 8 <= rollout["ours_tokens"] <= 8 * 48 and rollout["speedup"] > 0
