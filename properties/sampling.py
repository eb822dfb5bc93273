"""Drive a backend's verifier over many blocks of one scenario and count what it emits.

Draft tokens are drawn ``d_{i+1} ~ q_i`` with a seeded generator; the backend
gets its own seeded generator. Every chunk of output is checked for structure
(shape, dtype, range, contiguous prefix, padding) before it is counted, so a
misbehaving backend fails with a named :class:`BackendOutputError` instead of
corrupting the statistics.

Device placement: the suite draws its own inputs on the CPU; :func:`on_device` puts what a backend
call gets on the device under test (``--specdec-device``) and :func:`device_generator` makes the
backend's generator there. Outputs come back to the CPU (:func:`integer_outputs`) before anything
is counted. On the CPU both are the identity, so CPU results are bit for bit what they were.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec_ref.contract import PAD_TOKEN, NotSupportedError

from .scenarios import Scenario

CHUNK = 1 << 16


class BackendOutputError(AssertionError):
    """The backend returned something that breaks the verifier contract's structure."""


class BackendError(Exception):
    """The backend raised while the suite called it; ``__cause__`` is the backend's own exception.

    Raised by the helpers that call a backend (``verify_rows`` here, the decoder checks' ``_decode``),
    so a check's outcome can tell "the backend raised" from a fault of the check itself.
    """


def on_device(*tensors, device=None) -> tuple:
    """``tensors`` on ``device`` (``None`` entries stay ``None``; ``device=None`` leaves every tensor where it is).

    The one place the suite moves a backend's inputs. A tensor already on ``device`` is returned itself
    (``Tensor.to`` makes no copy), so on the CPU nothing is copied or changed.
    """
    if device is None:
        return tensors
    return tuple(None if t is None else t.to(device) for t in tensors)


def device_generator(seed: int, device=None, *, cpu: torch.Generator | None = None) -> torch.Generator:
    """The generator a backend gets with its inputs on ``device`` (the CPU for ``None``): a new one seeded ``seed`` there.

    ``cpu``: a CPU generator the suite already drew the inputs with and hands on to the backend; it is
    returned itself when ``device`` is the CPU (so the CPU keeps that shared stream bit for bit), while
    on another device the backend gets its own generator seeded ``seed``.
    """
    device = torch.device(device or "cpu")
    if cpu is not None and device.type == "cpu":
        return cpu
    return torch.Generator(device=device).manual_seed(seed)


def call_backend(method, *args, what: str, **kwargs):
    """``method(*args, **kwargs)``; any exception but an assertion becomes a :class:`BackendError` naming ``what``."""
    __tracebackhide__ = True
    try:
        return method(*args, **kwargs)
    except (AssertionError, NotSupportedError):
        raise  # the suite's own assertions (e.g. a per-round hook) stay failures; so does a claim not honoured
    except Exception as exc:
        raise BackendError(f"{what} raised") from exc


@dataclass
class BlockCounts:
    """Counts over ``n`` verified blocks of one scenario.

    ``length[j]``: blocks with m = j. ``steps[j]``: at blocks that reached j < k,
    cells ``[rejected & token x (V), accepted & token x (V)]``. ``bonus``: token
    emitted at position k when all k drafts were accepted.
    """

    scenario: str
    n: int
    seed: int
    length: np.ndarray
    steps: np.ndarray
    bonus: np.ndarray

    def emitted(self, j: int) -> np.ndarray:
        """Token emitted at position j among blocks that reached j."""
        if j == self.steps.shape[0]:
            return self.bonus
        vocab = self.bonus.shape[0]
        return self.steps[j, :vocab] + self.steps[j, vocab:]

    def residual(self, j: int) -> np.ndarray:
        return self.steps[j, : self.bonus.shape[0]]


def integer_outputs(result, shapes: dict[str, tuple[int, ...]], *, call: str, where: str) -> list[torch.Tensor]:
    """The tuple a backend call returned, each member an int64/int32 tensor of the named shape, as int64 on the CPU;
    :class:`BackendOutputError` naming the member otherwise."""
    __tracebackhide__ = True
    if not (isinstance(result, tuple) and len(result) == len(shapes)):
        raise BackendOutputError(f"{where}: {call} must return ({', '.join(shapes)}), got {type(result).__name__}")
    for (name, shape), t in zip(shapes.items(), result):
        if not isinstance(t, torch.Tensor):
            raise BackendOutputError(f"{where}: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int64, torch.int32):
            raise BackendOutputError(f"{where}: {name} must be int64 (or int32), got {t.dtype}")
        if tuple(t.shape) != shape:
            raise BackendOutputError(f"{where}: {name} must have shape {shape}, got {tuple(t.shape)}")
    return [t.long().cpu() for t in result]


def check_block_output(
    draft_tokens: torch.Tensor,
    result,
    *,
    vocab: int,
    where: str,
    bonus: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Structural contract of one verify() output; raises BackendOutputError naming the row.

    ``bonus=False`` (a backend declaring the no-bonus variant): a fully accepted row ends with
    ``PAD_TOKEN`` at position k, and only there may the emitted token be missing."""
    __tracebackhide__ = True
    batch, k = draft_tokens.shape
    m, tokens = integer_outputs(result, {"num_accepted": (batch,), "tokens": (batch, k + 1)}, call="verify()", where=where)
    drafts = draft_tokens.cpu()
    bad = (m < 0) | (m > k)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise BackendOutputError(f"{where}: num_accepted[{row}] = {int(m[row])} is outside [0, {k}]")
    positions = torch.arange(k + 1)
    before = positions[None, :] < m[:, None]
    after = positions[None, :] > m[:, None]
    padded = torch.cat([drafts, torch.zeros(batch, 1, dtype=drafts.dtype)], 1)
    wrong_prefix = before & (tokens != padded)
    if wrong_prefix.any():
        row, pos = (int(x) for x in wrong_prefix.nonzero()[0])
        raise BackendOutputError(
            f"{where}: row {row} accepted m={int(m[row])} drafts but tokens[{row}, {pos}] = {int(tokens[row, pos])} "
            f"is not the draft token {int(drafts[row, pos])}: accepted tokens must be the drafts' contiguous prefix"
        )
    wrong_pad = after & (tokens != PAD_TOKEN)
    if wrong_pad.any():
        row, pos = (int(x) for x in wrong_pad.nonzero()[0])
        raise BackendOutputError(
            f"{where}: row {row} with m={int(m[row])} has tokens[{row}, {pos}] = {int(tokens[row, pos])}; "
            f"positions after m must be {PAD_TOKEN}"
        )
    final = tokens.gather(1, m[:, None]).squeeze(1)
    if not bonus:
        bonus_given = (m == k) & (final != PAD_TOKEN)
        if bonus_given.any():
            row = int(bonus_given.nonzero()[0])
            raise BackendOutputError(
                f"{where}: row {row} accepted all k={k} drafts and emitted a bonus token {int(final[row])}, "
                f"but the backend declares bonus=False (tokens[{row}, {k}] must be {PAD_TOKEN})"
            )
        final = torch.where(m == k, 0, final)
    bad = (final < 0) | (final >= vocab)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise BackendOutputError(
            f"{where}: row {row}: the emitted token tokens[{row}, m={int(m[row])}] = {int(final[row])} is not in [0, {vocab})"
        )
    return m, tokens


def draw_drafts(draft: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    """``d_{i+1} ~ q_i`` independently for each row i of ``draft[k, V]``: Long[batch, k]."""
    return torch.multinomial(draft, batch, replacement=True, generator=generator).T.contiguous()


def is_batched(backend) -> bool:
    """Whether ``backend`` claims B > 1 per ``verify`` call (objects without capabilities count as batched)."""
    caps = getattr(backend, "capabilities", None)
    return bool(getattr(caps, "batched", True))


def emits_bonus(backend) -> bool:
    """Whether a fully accepted block ends with a bonus token (``Capabilities.bonus``; default True)."""
    caps = getattr(backend, "capabilities", None)
    return bool(getattr(caps, "bonus", True))


def row_generator(generator, i: int):
    """The generator a B = 1 call for row ``i`` gets: the shared one, or row ``i``'s entry of a per-row list."""
    return generator[i] if isinstance(generator, (list, tuple)) else generator


def verify_rows(backend, draft_tokens, draft_probs, target_probs, *, generator, where: str, vocab: int, device=None):
    """``verify`` on a batch, one B=1 call per row for a backend that does not claim ``batched``.

    Every call's output is structure-checked; returns ``(m[B], tokens[B, k+1])`` on the CPU. The generator is
    threaded through the calls in row order, so a batch is as reproducible as one batched call (a per-row
    list gives each call its row's entry). ``device``: where the inputs are put (:func:`on_device`; the
    generators must already live there, :func:`device_generator`); ``None`` leaves them where they are.
    """
    __tracebackhide__ = True
    draft_tokens, draft_probs, target_probs = on_device(draft_tokens, draft_probs, target_probs, device=device)
    if is_batched(backend):
        out = call_backend(backend.verify, draft_tokens, draft_probs, target_probs, generator=generator, what=f"verify() ({where})")
        return check_block_output(draft_tokens, out, vocab=vocab, where=where, bonus=emits_bonus(backend))
    batch, k = draft_tokens.shape
    m = torch.empty(batch, dtype=torch.long)
    tokens = torch.empty(batch, k + 1, dtype=torch.long)
    for i in range(batch):
        dt = draft_tokens[i : i + 1]
        dp = None if draft_probs is None else draft_probs[i : i + 1]
        row_where = f"{where} (row {i}, one B=1 call per row)"
        out = call_backend(backend.verify, dt, dp, target_probs[i : i + 1], generator=row_generator(generator, i), what=f"verify() ({row_where})")
        mi, ti = check_block_output(dt, out, vocab=vocab, where=row_where, bonus=emits_bonus(backend))
        m[i], tokens[i] = mi[0], ti[0]
    return m, tokens


def count_blocks(
    backend,
    scenario: Scenario,
    n: int,
    seed: int,
    *,
    filler: Scenario | None = None,
    chunk: int = CHUNK,
    max_blocks: int | None = None,
    device=None,
) -> BlockCounts:
    """Verify ``n`` blocks of ``scenario`` and count the outcomes.

    With ``filler``, each call's batch interleaves filler rows (even) with
    scenario rows (odd) and only scenario rows are counted: a verifier whose
    row results depend on other rows' contents shows up as a wrong law.

    A backend that does not claim ``batched`` gets one B=1 ``verify`` call per
    block (the drafts are drawn exactly as for a batched backend) and, with
    ``max_blocks``, stops after that many blocks; the returned ``n`` is the number
    actually verified, so every statistic built on it states its own power.

    ``device``: where the backend's inputs and its generator live (drafts are always drawn on the CPU).
    """
    if not is_batched(backend) and max_blocks is not None:
        n = min(n, max_blocks)
    sampler = BlockSampler(backend, scenario, seed, filler=filler, device=device)
    parts, done = [], 0
    while done < n:
        parts.append(sampler.draw(min(chunk, n - done)))
        done += parts[-1].n
    return sum_counts(parts) if parts else sampler.empty()


class BlockSampler:
    """Verifies blocks of ``scenario`` in consecutive calls of :meth:`draw`, each continuing the generators (drafts
    from ``2 seed``, the verifier's from ``2 seed + 1``) where the previous one left them: the counts of calls of b1,
    b2, ... blocks summed are those of one run over the same blocks in calls of those sizes (``count_blocks``, and
    the verifier checks' samples that grow across a case's looks)."""

    def __init__(self, backend, scenario: Scenario, seed: int, *, filler: Scenario | None = None, device=None):
        if filler is not None and not is_batched(backend):
            raise ValueError("a batch filler needs a backend that claims `batched`")
        if filler is not None and (filler.k, filler.vocab) != (scenario.k, scenario.vocab):
            raise ValueError("filler scenario must have the same k and V")
        self.backend, self.scenario, self.seed, self.filler, self.device = backend, scenario, seed, filler, device
        self.target = torch.tensor(scenario.target, dtype=torch.float32)
        self.draft = torch.tensor(scenario.draft, dtype=torch.float32)
        if filler is not None:
            self.f_target = torch.tensor(filler.target, dtype=torch.float32)
            self.f_draft = torch.tensor(filler.draft, dtype=torch.float32)
        self.draft_gen = torch.Generator().manual_seed(2 * seed)
        self.verify_gen = device_generator(2 * seed + 1, device)
        self.done = 0

    def empty(self) -> BlockCounts:
        k, vocab = self.scenario.k, self.scenario.vocab
        return BlockCounts(self.scenario.name, 0, self.seed, np.zeros(k + 1, dtype=np.int64),
                           np.zeros((k, 2 * vocab), dtype=np.int64), np.zeros(vocab, dtype=np.int64))

    def draw(self, b: int) -> BlockCounts:
        """The counts of the next ``b`` blocks (one backend call, or one B=1 call per block)."""
        k, vocab, filler = self.scenario.k, self.scenario.vocab, self.filler
        target, draft = self.target, self.draft
        drafts = draw_drafts(draft, b, self.draft_gen)
        if filler is None:
            tp, dp, dt = target.expand(b, -1, -1), draft.expand(b, -1, -1), drafts
        else:
            f_drafts = draw_drafts(self.f_draft, b, self.draft_gen)
            dt = torch.stack([f_drafts, drafts], 1).reshape(2 * b, k)
            tp = torch.stack([self.f_target.expand(b, -1, -1), target.expand(b, -1, -1)], 1).reshape(2 * b, k + 1, vocab)
            dp = torch.stack([self.f_draft.expand(b, -1, -1), draft.expand(b, -1, -1)], 1).reshape(2 * b, k, vocab)
        where = f"scenario {self.scenario.name!r}, seed {self.seed}, blocks {self.done}..{self.done + b - 1}"
        m, tokens = verify_rows(self.backend, dt, dp, tp, generator=self.verify_gen, where=where, vocab=vocab, device=self.device)
        if filler is not None:
            m, tokens = m[1::2], tokens[1::2]
        counts = self.empty()
        counts.n = b
        counts.length += np.bincount(m.numpy(), minlength=k + 1)
        positions, mm = torch.arange(k), m[:, None]
        # position j's cell: (j, accepted there (m > j), token); a position not reached (m < j) goes to one extra cell
        cells = (positions * 2 * vocab)[None, :] + (positions[None, :] < mm) * vocab + tokens[:, :k].clamp_min(0)
        cells = torch.where(positions[None, :] <= mm, cells, k * 2 * vocab)
        counts.steps += np.bincount(cells.numpy().ravel(), minlength=k * 2 * vocab + 1)[:-1].reshape(k, 2 * vocab)
        bonus = torch.where(m == k, tokens[:, k], PAD_TOKEN)  # none without a bonus (PAD_TOKEN there)
        counts.bonus += np.bincount(bonus.numpy() + 1, minlength=vocab + 1)[1:]
        self.done += b
        return counts


def sum_counts(parts: list[BlockCounts]) -> BlockCounts:
    """The counts of several draws of one scenario and seed together (``n`` adds up)."""
    first = parts[0]
    return BlockCounts(first.scenario, sum(p.n for p in parts), first.seed, sum(p.length for p in parts),
                       sum(p.steps for p in parts), sum(p.bonus for p in parts))
