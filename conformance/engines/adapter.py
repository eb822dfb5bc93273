"""What an engine adapter provides, and the registry of adapters (imported only when chosen).

An engine is certified from outside, through its public API, by one folder (``conformance/engines/<name>/``: its
adapter, which subclasses :class:`EngineAdapter`, its ``env.sh`` and ``stage.sh``, its export and extras), found by
its folder name in :data:`ADAPTERS` (every folder here with an ``adapter.py``; the package path, imported only when
that engine is chosen: ``import conformance.engines`` never imports an engine). The shared runner
(:mod:`conformance.engines.runner`, ``python -m conformance.engines ENGINE --out DIR``) does everything else: a
worker process per configuration and target family with a timeout, the matrix of cases
(:mod:`conformance.engines.matrix`), certification with ``certify_samples``, localisation, efficiency against the
declared scheme's exact expectation, the per-seed identity, per-request seed and "did it speculate" checks, the
expectation file per engine version (``conformance/engines/expected/<name>-<version>.json``), the verdict table and replays.

An adapter declares, as data:

* ``name``, ``title``, ``version`` (the pinned version its expectation file is for) and ``install`` (the command
  that installs the engine: its venv script);
* ``configurations``: :class:`conformance.engines.matrix.Configuration` records, each with the scheme it declares;
* ``conventions``: :class:`Conventions` (top-k ties, where the first token comes from, what is known to differ);
* ``cases``: the names of the matrix cases it runs (default: every case whose settings it can express);
* ``patches``: opt-in fixes the worker may apply (``--patch``), by name;
* ``conditions``: the serving conditions it runs (:mod:`conformance.engines.conditions`), each with the configurations
  that run it; such an adapter implements :meth:`EngineAdapter.open_condition` (the condition's knobs mapped to the
  engine's settings) and its sessions report the evidence (``condition_counters``).

and implements :meth:`EngineAdapter.python` (an interpreter that imports the engine), and in the worker process only
:meth:`EngineAdapter.installed_version` and :meth:`EngineAdapter.open` (load the engine for one configuration and
target family: an :class:`EngineSession`); optionally :meth:`EngineAdapter.export` (the checkpoints in its format and
their logits against the tables), :meth:`EngineAdapter.apply_patches` and :meth:`EngineAdapter.replay` (a standalone
replay script). An :class:`EngineSession` generates a batch of :class:`Request` and reads the engine's speculative
counters; :class:`conformance.engines.session.VariantSession` is the base most sessions need.

Invariant: an adapter never certifies anything itself; every verdict comes from the runner, the same for every
engine.
"""
from __future__ import annotations

import abc
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from specdec_ref.warp import SamplingConfig

from .conditions import condition_cases
from .matrix import CASES, EFFICIENCY, FAMILIES, FEATURE_CASES, Case, Configuration, law_depends_on_tie_rule

__all__ = [
    "ADAPTERS", "Conventions", "Request", "EngineSession", "EngineAdapter", "EngineMissingError", "adapter",
    "venv_python", "this_cpu_flags", "REPO",
]

REPO = Path(__file__).resolve().parents[2]

#: Engine name -> module path of its adapter (the module defines ``ADAPTER``, an :class:`EngineAdapter`).
def engine_folders() -> dict[str, str]:
    """Engine name -> its package: every folder of this package holding an ``adapter.py`` (``vllm`` ->
    ``conformance.engines.vllm``), listed without importing any engine. A new engine is its folder; its
    ``__init__`` exports ``ADAPTER``, whose ``name`` is the folder's."""
    here = Path(__file__).resolve().parent
    return {path.parent.name: f"{__package__}.{path.parent.name}" for path in sorted(here.glob("*/adapter.py"))}


ADAPTERS = engine_folders()


class EngineMissingError(RuntimeError):
    """The engine is not installed where the runner looks: the message names the install command."""


#: Top-k tie rules an engine may declare: keep every token tied with the k-th (Hugging Face, vLLM), keep exactly k
#: with ties broken by the lowest id, or keep exactly k with no stated choice among tied tokens (the matrix then
#: leaves out the cases whose top-k cuts a tie: their law is not defined).
TOP_K_TIES = ("all", "lowest_ids", "unstated")


@dataclass(frozen=True)
class Conventions:
    """How the engine's sampling differs where engines legitimately differ. The exact law follows the declaration.

    ``top_k_ties``: :data:`TOP_K_TIES`; ``first_token_at_prefill``: the first generated token is a plain target
    sample at prefill and speculative rounds start after it (vLLM), else rounds start from the prompt (the
    efficiency expectation follows it); ``seeds``: ``per_request`` (each request's seed fixes its output),
    ``global`` (one engine seed) or ``none``; ``drafts_to_end``: a round drafts at most the tokens still to emit but
    one (``min(k, r - 1)``, llama.cpp), else always the proposer's full count (vLLM, which then counts drafts past
    ``max_tokens``); ``eos_draft``: how a drafted EOS the target matches is counted, ``accepted`` (an accepted draft)
    or ``target`` (before the round's last draft it ends the round as the target's own token, llama.cpp);
    ``logprobs``: which log-probabilities the engine returns (:data:`conformance.engines.logprobs.
    CONVENTIONS`: ``raw`` before the request's settings, ``processed`` of the law sampled from; None: it returns
    none); ``logprobs_top``: False for an engine that returns the returned token's log-probability only, never a top
    list (the top-n check is then not made, and the verdict says so); ``token_prefix``: what the engine's generated text puts before each token's name on the exactly-known
    vocabulary (vLLM ``" "``, llama.cpp ``""``; None: it returns no text, so no stop-string or streaming case);
    ``drafts_fit_context``: a round drafts at most ``n_ctx - cells - 2`` tokens (``cells``: the context's tokens before
    the round's input), and a context shift discards half the cells (llama-server: ``n_keep`` 0), so the rounds rebuilt
    under a condition with a context limit follow them; ``notes``: other conventions, stated for the verdict table."""

    top_k_ties: str = "all"
    first_token_at_prefill: bool = True
    seeds: str = "per_request"
    drafts_to_end: bool = False
    eos_draft: str = "accepted"
    logprobs: str | None = None
    logprobs_top: bool = True
    token_prefix: str | None = None
    drafts_fit_context: bool = False
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        if self.top_k_ties not in TOP_K_TIES:
            raise ValueError(f"top_k_ties must be one of {TOP_K_TIES}, got {self.top_k_ties!r}")
        if self.seeds not in ("per_request", "global", "none"):
            raise ValueError(f"seeds must be per_request, global or none, got {self.seeds!r}")
        if self.eos_draft not in ("accepted", "target"):
            raise ValueError(f"eos_draft must be accepted or target, got {self.eos_draft!r}")
        if self.logprobs not in (None, "raw", "processed"):
            raise ValueError(f"logprobs must be raw, processed or None, got {self.logprobs!r}")

    def under(self, case):
        """``case`` as this engine runs it: its settings under the declared tie rule, its stop strings rendered with
        the engine's token prefix."""
        from dataclasses import replace

        if not case.texts:
            return replace(case, sampling=self.sampling(case.sampling))
        if self.token_prefix is None:
            raise ValueError(f"case {case.name!r} asks for the generated text; this engine's adapter declares no "
                             "token_prefix (it returns no text)")
        return replace(case, sampling=self.sampling(case.sampling), token_prefix=self.token_prefix,
                       stops=tuple(s.replace("{p}", self.token_prefix) for s in case.stops))

    def sampling(self, s: SamplingConfig) -> SamplingConfig:
        """The case's settings under this engine's declared tie rule (the law the runner certifies against)."""
        if self.top_k_ties != "lowest_ids" or not s.top_k:
            return s
        if "top_k_ties" not in getattr(type(s), "__dataclass_fields__", {}):
            raise RuntimeError("this specdec_ref has no SamplingConfig.top_k_ties: the lowest-ids rule cannot be stated")
        from dataclasses import replace

        return replace(s, top_k_ties="lowest_ids")


def this_cpu_flags() -> frozenset[str]:
    """The flags of this machine's CPU (``/proc/cpuinfo``; empty where there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(w for line in text.splitlines() if line.startswith("flags") for w in line.split(":", 1)[1].split())


@dataclass(frozen=True)
class Request:
    """One request of a case (or of the efficiency set): the prompt's token ids, its settings, and its seed."""

    case: str
    prompt: tuple[int, ...]
    sampling: SamplingConfig
    max_new_tokens: int
    eos: bool  # stop at the target's EOS (else EOS is an ordinary token: the engine must not stop on it)
    eos_id: int
    seed: int | None
    logprobs: int | None = None  # top-n log-probabilities asked per token (and per prompt token where offered)
    n: int = 1  # completions asked for (the record then holds "samples": one record per completion, with "index")
    stop: tuple[str, ...] = ()  # stop strings (the record then holds "text", the generated text returned)
    stream: bool = False  # streamed: the record's tokens and "text" are its chunks' put together


class EngineSession(Protocol):
    """One loaded engine (one configuration, one target family), in the worker process."""

    def generate(self, requests: Sequence[Request]) -> list[dict]:
        """One record per request, in order: ``{"completion_ids": [...], "finish_reason": ...}`` plus, where the
        engine reports them per request, ``"draft_tokens"`` and ``"accepted"`` (and ``"decode_s"``: its own time from
        the first generated token on, which profiles read); a request with ``n > 1`` gives
        ``{"samples": [record, ...]}``, one record per completion with its ``"index"``. Raises on an engine failure."""

    def counters(self) -> dict | None:
        """The engine's cumulative speculative counters, ``{"drafts", "draft_tokens", "accepted",
        "accepted_per_pos"}`` (``accepted_per_pos`` may be None), or None when it reports none."""

    def condition_counters(self) -> dict | None:
        """Optional (sessions of adapters that run conditions): what the engine reports now of
        :data:`conformance.engines.conditions.EVIDENCE` (counters cumulative; settings as it runs them)."""

    def refuses(self, request: Request) -> str | None:
        """Why the engine refuses these settings at submission (its own validation), without generating; or None."""

    def close(self) -> None:
        """Release the engine (stop its server, free its memory)."""


@dataclass(frozen=True)
class EngineAdapter(abc.ABC):
    """An engine as the runner sees it (see the module docstring): its data, and three methods every adapter
    implements (:meth:`python`, :meth:`installed_version`, :meth:`open`); :meth:`apply_patches`, :meth:`export` and
    :meth:`replay` have defaults."""

    name: str
    title: str
    version: str
    install: str
    configurations: tuple[Configuration, ...]
    conventions: Conventions = Conventions()
    cases: tuple[str, ...] | None = None  # None: every case of the matrix
    patches: dict = field(default_factory=dict)
    #: Serving condition name -> the configurations that run its cases (:mod:`conformance.engines.conditions`).
    conditions: dict = field(default_factory=dict)
    #: Condition knobs the engine has no counterpart for (knob -> why, e.g. an unpaged KV cache has no block size):
    #: :meth:`open_condition` accepts them, and evidence about them is stated as not applicable, never required.
    absent_knobs: dict = field(default_factory=dict)
    k: int = 3
    timeout_s: float = 420.0
    max_model_len: int = 128  # positions a request may use (prompt + new tokens + drafts) in this adapter's engine
    families: dict = field(default_factory=lambda: dict(FAMILIES))
    #: CPU flags (as ``/proc/cpuinfo`` spells them) whose presence changes what this engine version does (a wheel that
    #: executes an instruction without checking for it): its expectations are recorded per combination of them.
    cpu_features: tuple[str, ...] = ()
    #: Run the per-request seed probe (:mod:`conformance.engines.seeds`) where the conventions declare ``per_request``
    #: seeds. On for the adapters whose stage has been re-run with it; a failing probe is a new outcome for an engine's
    #: expectation file, so an adapter turns it on when its expectations are re-recorded.
    seed_probe: bool = False
    #: With ``--jobs N``, run each worker on its own share of the CPUs (an engine that binds its threads to every CPU
    #: it may use, as vLLM does, slows down many times over when two workers spin on the same cores).
    pin_workers: bool = False
    #: Modules a warm interpreter imports once per run, every worker then a fork of it
    #: (:mod:`conformance.engines.launch`); empty: every worker is a fresh interpreter.
    preload_modules: tuple[str, ...] = ()

    # ------------------------------------------------------------------ data
    def config(self, name: str) -> Configuration:
        for c in self.configurations:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: unknown configuration {name!r}; known: "
                       f"{', '.join(c.name for c in self.configurations)}")

    def all_cases(self) -> tuple[Case, ...]:
        """The matrix cases this engine runs (its declared list, less those its tie convention leaves undefined)."""
        chosen = CASES if self.cases is None else tuple(c for c in CASES + FEATURE_CASES if c.name in self.cases)
        if self.conventions.top_k_ties == "unstated":
            chosen = tuple(c for c in chosen if not law_depends_on_tie_rule(c))
        return chosen

    def cases_for(self, cfg: Configuration) -> tuple[Case, ...]:
        """The cases ``cfg`` runs: its matrix cases, then the cases of every condition the adapter runs it under."""
        mine = self.all_cases()
        mine = mine if cfg.cases is None else tuple(c for c in mine if c.name in cfg.cases)
        if self.conditions:
            mine += condition_cases(n for n, cfgs in self.conditions.items() if cfg.name in cfgs)
        return mine

    def k_of(self, cfg: Configuration) -> int:
        return cfg.k or self.k

    def logprobs_of(self, cfg: Configuration) -> str | None:
        """Which log-probabilities ``cfg`` returns (:attr:`Conventions.logprobs`); an adapter whose configurations
        choose it (an engine setting) overrides this."""
        return self.conventions.logprobs

    def work_estimate(self, cfg_name: str, family: str) -> float:
        """The tokens one worker (a configuration on a target family) asks for, its cases' and its efficiency set's:
        the order ``--jobs`` starts workers in (longest first, so that no job starts last and runs alone)."""
        cfg = self.config(cfg_name)
        tokens = sum(c.n * (c.max_new_tokens + len(c.prompt) // 8) for c in self.cases_for(cfg) if c.group == family)
        if cfg.speculative and family == EFFICIENCY.family:
            tokens += EFFICIENCY.n * EFFICIENCY.max_new_tokens
        return float(tokens * cfg.scale)

    def expected_path(self, version: str | None = None) -> Path:
        return Path(__file__).resolve().parent / "expected" / f"{self.name}-{version or self.version}.json"

    def expectation_key(self, patch_key: str, cpu_flags: frozenset[str] | None = None) -> str:
        """The key the expectations of a run are recorded under: its patches, and where :attr:`cpu_features` is
        declared, which of those flags this CPU has (``"unpatched, cpu +gfni"`` / ``"unpatched, cpu -gfni"``)."""
        if not self.cpu_features:
            return patch_key
        flags = cpu_flags if cpu_flags is not None else this_cpu_flags()
        return patch_key + ", cpu " + " ".join(("+" if f in flags else "-") + f for f in self.cpu_features)

    # ------------------------------------------------------------------ engine side (worker process only)
    @abc.abstractmethod
    def python(self) -> str:
        """An interpreter that can run the worker (imports the engine); raises :class:`EngineMissingError`."""

    @abc.abstractmethod
    def installed_version(self) -> str:
        """The engine's version as installed (in the worker process)."""

    def preload(self) -> None:
        """Import :attr:`preload_modules` (in the zygote, before any worker is forked from it): imports only, no
        engine, no thread. An adapter that sets environment variables its engine reads at import sets them here."""
        for name in self.preload_modules:
            importlib.import_module(name)

    def apply_patches(self, names: Sequence[str]) -> list[str]:
        if names:
            raise ValueError(f"{self.name} has no patches (asked for {', '.join(names)})")
        return []

    @abc.abstractmethod
    def open(self, cfg: Configuration, family: str) -> EngineSession:
        """Load the engine for one configuration on one target family (the pair of :attr:`families`): an
        :class:`EngineSession`. Raises when the engine refuses the set-up (the configuration's load error)."""

    def open_condition(self, cfg: Configuration, family: str, condition) -> EngineSession:
        """Load the engine for one configuration on one target family under a serving condition (a
        :class:`conformance.engines.conditions.Condition`: its knobs mapped to the engine's settings). Raises when
        the engine lacks a knob (say which) or refuses the set-up. Default: no knob is mapped."""
        raise NotImplementedError(f"{self.title}'s adapter maps no serving-condition knob ({condition.name}: "
                                  f"{', '.join(sorted(condition.settings))})")

    def export(self, check: bool = True) -> list[dict]:
        """Write the exactly-known checkpoints in the engine's own format (cached: only what is missing or stale) and,
        with ``check``, compare what the engine computes from them with the tables: one row per model and variant,
        ``{"model", "passed", "text"}``. Runs in the engine's interpreter (``python -m conformance.engines export
        ENGINE``, :mod:`conformance.engines.export`). Default: nothing to write (the engine loads the shipped
        Hugging Face folders as they are)."""
        return []

    def replay(self, cfg: Configuration, case: Case, *, patch: str, departure: str, length: int, law: dict, n: int,
               critical: float, path: Path) -> str | None:
        """A standalone script reproducing a failing case (written to ``path``), or None: the runner then gives
        the command that reruns the one case."""
        return None


def venv_python(module: str, venv: str, install: str) -> str:
    """This interpreter if it imports ``module``, else ``<repo>/<venv>/bin/python``; else :class:`EngineMissingError`."""
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    py = REPO / venv / "bin" / "python"
    if py.exists():
        return str(py)
    raise EngineMissingError(f"{module} is not importable here and there is no {venv}: build it with `{install}`")


def adapter(name: str) -> EngineAdapter:
    """The registered adapter ``name`` (its module imported now, not before), or ``package.module:ATTRIBUTE`` for an
    adapter that is not registered here (your own engine's)."""
    if ":" in name:
        module, _, attr = name.partition(":")
        found = getattr(importlib.import_module(module), attr, None)
        if not isinstance(found, EngineAdapter):
            raise KeyError(f"{name!r} is not an EngineAdapter")
        return found
    if name not in ADAPTERS:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(ADAPTERS))} (or module:ATTRIBUTE)")
    return importlib.import_module(ADAPTERS[name]).ADAPTER
