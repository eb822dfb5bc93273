"""scripts/gpu_check.py (its CPU dry run and its no-CUDA exit) and the --specdec-device option.

The CUDA path itself needs a GPU; here the dry run runs every row on the CPU with tiny sizes, and
the device option is checked on the CPU: ``cuda`` without CUDA is a usage error, ``cpu`` runs checks
normally, a backend not claiming the device gets its checks skipped, and on the CPU the placement
helpers change nothing (same tensors, same generator streams).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.plugin import device_case
from conformance.registry import CheckContext, all_cases, run_case
from specdec_properties.sampling import device_generator, on_device
from specdec_ref.backend import ReferenceBackend

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
WRAPPER = ROOT / "scripts" / "gpu_check.sh"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the behaviour without CUDA")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh run: no enclosing pytest/xdist settings, no backend or dry-run override."""
    drop = ("SPECDEC_BACKEND", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "GPU_CHECK_DRY_RUN")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def run(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=clean_env(**env), capture_output=True, text=True, timeout=timeout)


def load_script():
    """scripts/gpu_check.py as a module (registered first: its dataclasses look their module up)."""
    name = "specdec_scripts_gpu_check"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------- scripts/gpu_check.py


def test_dry_run_passes_and_prints_every_row():
    proc = run([sys.executable, str(SCRIPT), "--dry-run"], timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("check "))
    assert [c.strip() for c in lines[header].split("|")] == ["check", "device", "dtype", "result", "seconds", "detail"]
    rows = [[c.strip() for c in line.split("|")] for line in lines[header + 2 :] if "|" in line]
    expected = [
        ("conformance verifier", "float32"),
        ("verifier throughput", "float32"),
        ("decoder greedy vs AR", "float32"),
        ("decoder greedy vs AR", "bfloat16"),
        ("proposers", "float32"),
        ("proposers", "bfloat16"),
    ]
    assert [(r[0], r[2]) for r in rows] == expected, proc.stdout
    for check, device, dtype, result, seconds, detail in rows:
        assert device == "cpu" and result == "PASS" and float(seconds) >= 0 and detail, proc.stdout
    by_name = {(r[0], r[2]): r[5] for r in rows}
    assert "passed" in by_name[("conformance verifier", "float32")]
    assert "tokens/s" in by_name[("verifier throughput", "float32")]
    assert "identical to AR" in by_name[("decoder greedy vs AR", "float32")]
    assert "flips /" in by_name[("decoder greedy vs AR", "bfloat16")] and "decodes" in by_name[("decoder greedy vs AR", "bfloat16")]
    assert "greedy == AR" in by_name[("proposers", "bfloat16")] and "eagle" in by_name[("proposers", "float32")]
    assert "6/6 rows passed" in proc.stdout


@NO_CUDA
def test_without_cuda_exits_2_with_one_line():
    proc = run(["bash", str(WRAPPER)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1 and "CUDA is not available" in message and "--dry-run" in message


def test_dry_run_from_the_environment(monkeypatch):
    module = load_script()
    monkeypatch.delenv("GPU_CHECK_DRY_RUN", raising=False)
    assert module.parse_args([]).dry_run is False
    assert module.parse_args(["--dry-run"]).dry_run is True
    monkeypatch.setenv("GPU_CHECK_DRY_RUN", "1")
    assert module.parse_args([]).dry_run is True


def test_table_format():
    module = load_script()
    rows = [module.Row("a check", "cuda", "float32", "PASS", 1.25, "fine"), module.Row("b", "cuda", "bfloat16", "FAIL", 12.0, "x")]
    table = module.format_table(rows).splitlines()
    assert table[0].split(" | ")[0].strip() == "check" and set(table[1]) <= {"-", "+"}
    assert "a check" in table[2] and "1.2" in table[2] and "FAIL" in table[3] and "12.0" in table[3]


# ----------------------------------------------------------------------------- --specdec-device


@NO_CUDA
def test_specdec_device_cuda_without_cuda_is_a_usage_error():
    proc = run([sys.executable, "-m", "pytest", "conformance/test_contract.py", "--specdec-device=cuda", "-p", "no:cacheprovider"], timeout=60)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "--specdec-device=cuda: torch.cuda.is_available() is False" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_specdec_device_cpu_runs_checks_normally():
    proc = run(
        [sys.executable, "-m", "pytest", "conformance/test_verifier.py", "--specdec-device=cpu", "-k", "structure_greedy", "-q", "-p", "no:cacheprovider"],
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def cpu_only_backend() -> ReferenceBackend:
    backend = ReferenceBackend()
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=("cpu",))
    return backend


def test_unclaimed_device_skips_verifier_and_tree_checks():
    backend = cpu_only_backend()
    cases = {c.check.family: c for c in all_cases()}
    for family in ("verifier", "tree"):
        record = run_case(device_case(cases[family], "cuda"), backend, CheckContext(device="cuda"))
        assert record.status == "skipped", record
        assert record.missing_capabilities == ["device:cuda"]
        assert "does not claim capability device:cuda" in record.message
    assert device_case(cases["decoder"], "cuda") is cases["decoder"]  # runs on the CPU whatever the option
    assert device_case(cases["verifier"], "cpu") is cases["verifier"]
    assert "device:cuda" in device_case(cases["verifier"], "cuda").check.requires
    assert device_case(cases["verifier"], "cuda").id == cases["verifier"].id


def test_placement_is_the_identity_on_cpu():
    t = torch.rand(3, 4)
    moved = on_device(t, None, t[:, :2], device="cpu")
    assert moved[0] is t and moved[1] is None and moved[2].data_ptr() == t.data_ptr()
    assert on_device(t, device=None)[0] is t
    a, b = device_generator(123, "cpu"), torch.Generator().manual_seed(123)
    assert torch.equal(torch.rand(64, generator=a), torch.rand(64, generator=b))
    shared = torch.Generator().manual_seed(5)
    assert device_generator(5, "cpu", cpu=shared) is shared
    assert device_generator(5, None, cpu=shared) is shared
