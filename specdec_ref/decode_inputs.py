"""The decoders' inputs, checked: the batch-1 arguments and a batch's requests (``ValueError`` naming the request and
the field, ``NotSupportedError`` for settings a decoder does not apply), and the validated batch (:class:`_Batch`).

Shared by the chain and tree decoders (:mod:`specdec_ref.decode`, :mod:`specdec_ref.tree_decode`,
:mod:`specdec_ref.tree_batch`). A prompt given as a list of ints is range-checked on the host and kept as host ids, so
validation reads nothing back from the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .contract import NotSupportedError, Request
from .forward import as_prompt
from .models import model_dims
from .proposers import is_model, proposer_kind
from .warp import SamplingConfig

__all__ = ["validate_requests"]


def _shared_limits(target, draft) -> tuple[int, int]:
    """``(V, max positions)`` of a target (and draft, ValueError on a vocabulary mismatch); 0 positions: unbounded.
    ``draft`` may be any proposer spec (:mod:`specdec_ref.proposers`): a head checks its own vocabulary."""
    dims = model_dims(target)
    vocab, max_pos = dims["vocab_size"], dims["max_positions"]
    if draft is not None and not is_model(draft):
        proposer_kind(draft)  # ValueError naming what a draft may be
        check = getattr(draft, "check_target", None)
        if check is not None:
            check(target)
    elif draft is not None:
        draft_vocab = model_dims(draft)["vocab_size"]
        if draft_vocab != vocab:
            raise ValueError(f"vocabulary mismatch: target has V={vocab}, draft has V={draft_vocab}")
        max_pos = min(max_pos, model_dims(draft)["max_positions"])
    return vocab, max_pos


def _validate_decode_args(target, draft, prompt, k, max_new_tokens, eos_id, sampling, *, history_ok: bool = False) -> torch.Tensor:
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    if sampling.history_dependent and not history_ok:
        raise NotSupportedError(f"this decoder does not apply history-dependent settings ({sampling.label()})")
    vocab, max_pos = _shared_limits(target, draft)
    prompt = as_prompt(prompt, vocab=vocab, device=next(target.parameters()).device)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < vocab):
        raise ValueError(f"eos_id must be None or a token id in [0, {vocab}), got {eos_id!r}")
    if max_pos and prompt.shape[1] + max_new_tokens > max_pos + 1:
        raise ValueError(
            f"prompt length {prompt.shape[1]} + max_new_tokens {max_new_tokens} exceeds the models' "
            f"max positions {max_pos} (+1 for the last token, which is never fed)"
        )
    return prompt


@dataclass
class _Batch:
    """The validated requests of one batched decode (rows in request order)."""

    prompts: list[torch.Tensor]  # Long[1, t_b] on the target's device (rows with the same plain prompt share one)
    configs: list[SamplingConfig]
    eos: list[tuple[int, ...]]
    max_new: list[int]
    generators: list[torch.Generator | None]
    tokens: list[list[int]]  # the prompts as host ids (read once, at validation)

    def __len__(self) -> int:
        return len(self.prompts)

    def rows(self, rows: Sequence[int]) -> "_Batch":
        """The batch of ``rows`` (in that order)."""
        return _Batch(*[[getattr(self, f)[i] for i in rows] for f in BATCH_FIELDS])

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order), in place: whoever holds this batch sees the rows that stay."""
        for f in BATCH_FIELDS:
            setattr(self, f, [getattr(self, f)[i] for i in rows])

    def pending(self) -> torch.Tensor:
        """Every row's first pending token (its prompt's last), Long ``[B, 1]``: one host-to-device copy."""
        return torch.tensor([[t[-1]] for t in self.tokens], dtype=torch.long, device=self.prompts[0].device)


#: The per-row fields of :class:`_Batch`, in order.
BATCH_FIELDS = ("prompts", "configs", "eos", "max_new", "generators", "tokens")


def _eos_ids(eos, vocab: int, where: str) -> tuple[int, ...]:
    ids = () if eos is None else (eos,) if isinstance(eos, int) and not isinstance(eos, bool) else eos
    try:
        ids = tuple(ids)
    except TypeError:
        raise ValueError(f"{where}: eos_ids must be None, a token id or a sequence of ids, got {eos!r}") from None
    for e in ids:
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < vocab:
            raise ValueError(f"{where}: eos id {e!r} is not a token id in [0, {vocab})")
    return ids


def _plain_prompt(prompt, vocab: int, device) -> torch.Tensor | None:
    """A non-empty list / tuple of Python ints in ``[0, vocab)`` as ``Long[1, t]`` on ``device`` (no tensor round trip,
    no host read-back), or None for anything else (``as_prompt`` then checks it and names what is wrong)."""
    if type(prompt) not in (list, tuple) or not prompt or not all(type(x) is int for x in prompt):
        return None
    if min(prompt) < 0 or max(prompt) >= vocab:
        return None
    return torch.tensor([prompt], dtype=torch.long, device=device)


def validate_requests(target, draft, requests: Sequence[Request], k: int) -> _Batch:
    """Check every request (ValueError naming the request and the field) and make seeded generators."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(requests, (list, tuple)) or not requests:
        raise ValueError(f"requests must be a non-empty list of Request, got {requests!r}")
    vocab, max_pos = _shared_limits(target, draft)
    device = next(target.parameters()).device
    batch = _Batch([], [], [], [], [], [])
    plain: dict[tuple, tuple] = {}  # a plain prompt seen before: its tensor and host ids, checked once
    for i, r in enumerate(requests):
        where = f"request {i}"
        if not isinstance(r, Request):
            raise ValueError(f"{where}: must be a specdec_ref.contract.Request, got {type(r).__name__}")
        if not isinstance(r.sampling, SamplingConfig):
            raise ValueError(f"{where}: sampling must be a SamplingConfig, got {type(r.sampling).__name__}")
        key = tuple(r.prompt) if type(r.prompt) in (list, tuple) else None
        hit = plain.get(key) if key is not None else None
        if hit is not None:
            prompt, ids = hit[0], list(key)  # the tensor is shared (read-only), the host list is the row's own
        else:
            prompt = _plain_prompt(r.prompt, vocab, device)
            if prompt is None:  # a tensor, or anything the fast path does not vouch for: the full checks and messages
                prompt = as_prompt(r.prompt, vocab=vocab, device=device, what=f"{where}: prompt")
                ids = prompt[0].tolist()
            else:
                ids = list(key)
                plain[key] = (prompt, ids)
        n = r.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{where}: max_new_tokens must be an int >= 0, got {n!r}")
        if max_pos and prompt.shape[1] + n > max_pos + 1:
            raise ValueError(
                f"{where}: prompt length {prompt.shape[1]} + max_new_tokens {n} exceeds the models' max positions "
                f"{max_pos} (+1 for the last token, which is never fed)"
            )
        gen = r.generator
        if gen is not None and not isinstance(gen, torch.Generator):
            raise ValueError(f"{where}: generator must be a torch.Generator or None, got {type(gen).__name__}")
        if r.seed is not None:
            if gen is not None:
                raise ValueError(f"{where}: give a generator or a seed, not both")
            if isinstance(r.seed, bool) or not isinstance(r.seed, int):
                raise ValueError(f"{where}: seed must be an int, got {r.seed!r}")
            gen = torch.Generator(device=device).manual_seed(r.seed)
        batch.prompts.append(prompt)
        batch.configs.append(r.sampling)
        batch.eos.append(_eos_ids(r.eos_ids, vocab, where))
        batch.max_new.append(n)
        batch.generators.append(gen)
        batch.tokens.append(ids)
    return batch
