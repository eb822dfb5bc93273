"""Backend adapters that put Hugging Face transformers' own speculative-decoding pieces behind our contract.

Three factories, one per piece, for ``--specdec-backend=specdec_ref.adapters.hf_backends:<factory>``:

* :func:`hf_verifier` -- ``transformers.generation.utils._speculative_sampling`` (sampling) and a
  line-for-line reproduction of the greedy branch of ``GenerationMixin._assisted_decoding``
  (greedy; it is inline code there, not a function, so it cannot be called).
* :func:`hf_cache` -- a raw ``transformers.DynamicCache`` rolled back exactly the way transformers'
  assisted generation rolls it back: ``cache.crop(-tokens_to_remove)``.
* :func:`hf_assisted_decoder` -- ``target.generate(..., assistant_model=draft)``.

What the adapters add on top of transformers, stated so the verdict can be read honestly:

* **Global RNG.** transformers draws from the *global* torch RNG (``torch.rand_like`` and
  ``torch.multinomial`` without a generator, in ``_speculative_sampling`` and in ``generate``); its
  API takes no generator. So that results are reproducible per ``generator``, the adapters draw one
  64-bit seed from the given generator and run transformers inside ``torch.random.fork_rng()`` with
  the global RNG seeded from it (the caller's global RNG state is restored afterwards). The check
  ``sampling_ignores_global_rng`` therefore tests this adapter, not transformers: transformers itself
  *does* depend on (and advance) the global RNG. With ``generator=None`` the adapters call
  transformers on the global RNG directly, as it is.
* **Logits.** ``_speculative_sampling`` takes logits; the contract hands probabilities. The adapter
  passes ``log(probs)`` in float64 (zeros become ``-inf``, which its softmax maps back to 0), so
  transformers computes in float64 and sees ``softmax(log p) = p / sum(p)`` to float64 rounding:
  rows with ``p == q`` give ratios of exactly 1, and distinct float32 probabilities keep distinct
  logits (in float32, ``log`` maps about a third of adjacent float32 values to one logit, which
  turned near-ties into exact ties for the greedy argmax).
* **Batch.** transformers' verifier is batch 1 (``squeeze(0, 1)``, ``n_matches`` summed over the
  batch); :class:`HFVerifierBackend` claims ``batched=False`` and, if handed B > 1 anyway, loops rows.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

import torch

from ..cache import ModelCache
from ..contract import PAD_TOKEN, Capabilities, NotSupportedError

__all__ = [
    "HFVerifierBackend",
    "HFCacheBackend",
    "HFDynamicCache",
    "HFAssistedDecoderBackend",
    "ForwardProbe",
    "hf_assisted_drafts",
    "hf_sampling_options",
    "pinned_draft_length",
    "hf_verifier",
    "hf_cache",
    "hf_assisted_decoder",
    "hf_assisted_decoder_unvalidated",
    "transformers_version",
    "seeded_global_rng",
    "hf_greedy_select",
]


def transformers_version() -> str:
    import transformers

    return transformers.__version__


@contextlib.contextmanager
def seeded_global_rng(generator: torch.Generator | None) -> Iterator[None]:
    """Run the body on a global torch RNG seeded from ``generator`` (restored afterwards).

    With ``generator=None`` this does nothing: the body uses (and advances) the global RNG, which is
    what transformers does on its own. This is the adapter's addition, not transformers' behaviour.
    """
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


# ----------------------------------------------------------------------------- verifier


def hf_greedy_select(candidate_input_ids: torch.Tensor, cur_len: int, new_logits: torch.Tensor) -> torch.Tensor:
    """The greedy branch of transformers 5.24 ``GenerationMixin._assisted_decoding`` (step 3, case 2), verbatim.

    There it is inline code, not a function, so it is reproduced here (no ensemble weight, no logits
    processors: greedy ``generate`` with default settings adds none that change the argmax). Returns
    ``valid_tokens[1, n_matches + 1]``.
    """
    selected_tokens = new_logits.argmax(dim=-1)
    candidate_new_tokens = candidate_input_ids[:, cur_len:]
    n_matches = ((~(candidate_new_tokens == selected_tokens[:, :-1])).cumsum(dim=-1) < 1).sum()
    valid_tokens = selected_tokens[:, : n_matches + 1]
    return valid_tokens


def _logits(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is ``probs / probs.sum(-1)`` to float64 rounding (zeros -> ``-inf`` -> 0).

    float64, not float32: transformers then computes its softmax, ratios and residual in float64,
    so identical rows stay identical and distinct probabilities keep distinct logits.
    """
    return probs.to(torch.float64).log()


class HFVerifierBackend:
    """transformers' ``_speculative_sampling`` (sampling) and assisted-greedy selection (greedy), batch 1."""

    name = "transformers.assisted"
    capabilities = Capabilities(
        verifier=True,
        greedy=True,
        sampling=True,
        dtypes=("float32",),
        devices=("cpu",),
        extra={"global_rng": "transformers samples from the global torch RNG; the adapter seeds it from `generator` inside fork_rng"},
    )

    def __init__(self):
        self.version = transformers_version()

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator: torch.Generator | None = None):
        from transformers.generation.utils import _speculative_sampling

        batch, k = draft_tokens.shape
        num_accepted = torch.zeros(batch, dtype=torch.long)
        tokens = torch.full((batch, k + 1), PAD_TOKEN, dtype=torch.long)
        with seeded_global_rng(generator if draft_probs is not None else None):
            for b in range(batch):
                cand = draft_tokens[b : b + 1].long()
                new_logits = _logits(target_probs[b : b + 1])
                if draft_probs is None:
                    valid = hf_greedy_select(cand, 0, new_logits)
                else:
                    valid, _ = _speculative_sampling(cand, _logits(draft_probs[b : b + 1]), k, new_logits)
                valid = valid.reshape(-1)
                n = valid.numel()
                num_accepted[b] = n - 1
                tokens[b, :n] = valid
        return num_accepted, tokens


def hf_verifier() -> HFVerifierBackend:
    return HFVerifierBackend()


# ----------------------------------------------------------------------------- cache


class HFDynamicCache(ModelCache):
    """``ModelCache`` over a raw ``DynamicCache`` rolled back with transformers' own call.

    transformers 5.24's assisted generation rolls both caches back with
    ``cache.crop(-tokens_to_remove)`` (``_assisted_decoding`` step 4.2:
    ``outputs.cache.crop(-number_of_tokens_to_crop)``; ``AssistedCandidateGenerator._update_past_and_masks``:
    ``crop(-(current_cache_size - target_cache_size))`` when that count is >= 0). ``_crop_to`` calls
    exactly that, with no special case for an empty result (the reference resets instead), so a rollback
    to length 0 is ``crop(-tentative_length)``.
    """

    def _crop_to(self, n: int) -> None:
        tokens_to_remove = self._cache.get_seq_length() - n
        if tokens_to_remove >= 0:
            self._cache.crop(-tokens_to_remove)


class HFCacheBackend:
    name = "transformers.DynamicCache"
    capabilities = Capabilities(cache=True, dtypes=("float32",), devices=("cpu",))

    def __init__(self):
        self.version = transformers_version()

    def make_cache(self, model) -> HFDynamicCache:
        return HFDynamicCache(model)


def hf_cache() -> HFCacheBackend:
    return HFCacheBackend()


# ----------------------------------------------------------------------------- decoder


class ForwardProbe:
    """Forward calls of one transformers model: (input length, cache length) per call, wall seconds inside them.

    A pre/post hook pair on the top-level module (about a microsecond per call against a forward of
    a few hundred). It sees the calls that go through the module (transformers ``generate``,
    ``ModelCache``), not the lean static forward of ``StaticModelCache``, which uses the weights
    directly. The cache length (``cache.get_seq_length()``) lets :func:`hf_assisted_drafts` recover
    how many tokens transformers' assisted generation drafted each round. Call :meth:`remove` when done.
    """

    def __init__(self, model: torch.nn.Module):
        self.reset()
        self._t0 = 0.0
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post),
        ]

    def reset(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.seconds = 0.0

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache")
        self.calls.append((0 if ids is None else int(ids.shape[-1]), 0 if cache is None else int(cache.get_seq_length())))
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._t0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def hf_assisted_drafts(target_calls: Sequence[tuple[int, int]], prompt_len: int) -> list[tuple[int, int]]:
    """(drafted, cur_len) per round of transformers' assisted generation, from the target's forward calls.

    Round ``r`` is target call ``r`` (:attr:`ForwardProbe.calls`): the first feeds prompt + candidates
    on an empty cache, later ones ``[last token, candidates]`` on a cache of ``cur_len - 1`` tokens
    (``cur_len`` = committed length the round starts from). The expected draft is
    ``min(k, max_length - cur_len - 1)``, as in ``AssistedCandidateGenerator._calculate_new_tokens``.
    """
    out = []
    for inputs, cached in target_calls:
        cur_len = prompt_len if cached == 0 else cached + 1
        out.append((cached + inputs - cur_len, cur_len))
    return out


def hf_sampling_options(sampling) -> dict[str, Any]:
    """``GenerationConfig`` options for a :class:`specdec_ref.warp.SamplingConfig`.

    Greedy: ``do_sample=False``. Sampling: ``top_k=None`` / ``top_p=None`` become 0 / 1.0, because
    unset transformers would apply its own default ``top_k=50``. transformers' top-k keeps every token tied
    with the k-th (``top_k_ties="all"``); another tie rule raises :class:`NotSupportedError`.
    """
    if sampling.greedy:
        return dict(do_sample=False)
    if sampling.top_k is not None and sampling.top_k_ties != "all":
        raise NotSupportedError(
            f"transformers' top-k keeps every token tied with the k-th largest logit; top_k_ties={sampling.top_k_ties!r} "
            "cannot be sampled with it"
        )
    return dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)


@contextlib.contextmanager
def pinned_draft_length(draft, k: int) -> Iterator[None]:
    """Pin transformers' draft length to ``k`` every round (restored afterwards).

    transformers 5.24's ``AssistedCandidateGenerator`` reads ``num_assistant_tokens``,
    ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold`` from the *draft* model's
    own ``generation_config``, not from the one passed to ``generate`` (where they are silently
    ignored; unset they default to 20 tokens, a heuristic schedule and a 0.4 confidence early stop).
    A threshold of 0 adds no ``ConfidenceCriteria`` and skips the (sklearn) threshold adaptation:
    k drafts every round.
    """
    pin = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    config = draft.generation_config
    missing = object()
    saved = {key: getattr(config, key, missing) for key in pin}
    for key, value in pin.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is missing:
                delattr(config, key)
            else:
                setattr(config, key, value)


class HFAssistedDecoderBackend:
    """``target.generate(prompt, assistant_model=draft)`` behind the decoder contract (batch 1).

    ``rounds`` are reconstructed from forward hooks on the target (:class:`ForwardProbe` /
    :func:`hf_assisted_drafts`): round r is target call r; it drafted ``cached + inputs - cur_len`` tokens
    and committed ``next cur_len - cur_len`` (the final length for the last round), of which all but one
    are accepted drafts. Cache lengths in the records are not observed (set to -1) and ``on_round`` is
    never called: this backend does not claim ``cache``.
    """

    name = "transformers.generate(assistant_model=...)"
    capabilities = Capabilities(
        greedy=True,
        sampling=True,
        decoder=True,
        top_k=True,
        top_p=True,
        dtypes=("float32", "bfloat16"),
        devices=("cpu",),
        extra={"global_rng": "transformers samples from the global torch RNG; the adapter seeds it from `generator` inside fork_rng"},
    )

    def __init__(self, *, validate: bool = True):
        self.version = transformers_version()
        self.validate = validate

    def decode(self, target, draft, prompt, *, k, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None):
        from transformers import GenerationConfig

        from ..decode import DecodeResult, RoundRecord, _truncate
        from ..decode_inputs import _validate_decode_args

        if self.validate:
            prompt = _validate_decode_args(target, draft, prompt, k, max_new_tokens, eos_id, sampling)
        prompt_len = prompt.shape[1]
        if max_new_tokens == 0:
            return DecodeResult(tokens=[], prompt_len=prompt_len, finished_by="max_new_tokens")
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=0 if eos_id is None else eos_id,
            **hf_sampling_options(sampling),
        )
        probes = {"target": ForwardProbe(target), "draft": ForwardProbe(draft)}
        try:
            with pinned_draft_length(draft, k), seeded_global_rng(generator), torch.no_grad():
                out = target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft, generation_config=config
                )
        finally:
            for probe in probes.values():
                probe.remove()
        generated = out[0, prompt_len:].tolist()
        tokens, stopped = _truncate(generated, eos_id)
        result = DecodeResult(
            tokens=tokens,
            prompt_len=prompt_len,
            finished_by="eos" if stopped else "max_new_tokens",
            target_calls=len(probes["target"].calls),
            draft_calls=len(probes["draft"].calls),
        )
        drafts = hf_assisted_drafts(probes["target"].calls, prompt_len)
        end = prompt_len + len(generated)
        for r, (proposed, cur_len) in enumerate(drafts):
            nxt = drafts[r + 1][1] if r + 1 < len(drafts) else end
            emitted = nxt - cur_len
            result.rounds.append(
                RoundRecord(
                    round=r,
                    start=cur_len,
                    proposed=proposed,
                    accepted=max(emitted - 1, 0),
                    emitted=emitted,
                    target_len=-1,
                    draft_len=-1,
                    committed_len=nxt,
                    target_calls=r + 1,
                    draft_calls=-1,
                )
            )
        return result


def hf_assisted_decoder() -> HFAssistedDecoderBackend:
    return HFAssistedDecoderBackend()


def hf_assisted_decoder_unvalidated() -> HFAssistedDecoderBackend:
    """The same adapter without our argument validation: what transformers itself does with bad input."""
    return HFAssistedDecoderBackend(validate=False)
