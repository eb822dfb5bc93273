"""The records the runner's checks produce, typed: a case's verdict, a configuration's, and the outcome levels.

In memory the runner holds :class:`CaseVerdict` and :class:`ConfigVerdict`; on disk (``verdicts.json``, read by
:mod:`conformance.engines.report` and :mod:`conformance.engines.table`) they are their :meth:`as_dict`, levels as
their string values, fields without a value left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

__all__ = ["Level", "ENGINE_LEVELS", "Check", "CaseVerdict", "ConfigVerdict"]


class Level(str, Enum):
    """A case's outcome: the black-box tool's verdict words, or why the engine produced no verdict."""

    CERTIFIED = "certified"
    REDUCED = "reduced"  # certified at reduced power
    NOT_CERTIFIED = "not_certified"
    INCONCLUSIVE = "inconclusive"
    NOT_SPECULATING = "not_speculating"  # a speculative configuration that drafted nothing
    NOT_REACHED = "not_reached"  # a serving condition's evidence did not hold: the engine was not shown to reach it
    REFUSED = "refused"  # the engine refused the settings at submission
    ENGINE_ERROR = "engine_error"  # it crashed (after one rerun of the case alone)
    LOAD_ERROR = "load_error"  # it could not load the configuration
    TIMEOUT = "timeout"  # it hung: the worker's process group was killed
    NOT_RUN = "not_run"  # it failed earlier in the same process
    TOOL_ERROR = "tool_error"  # our own tooling failed: never an expected outcome

    def __str__(self) -> str:
        return self.value

    @property
    def words(self) -> str:
        return self.value.upper().replace("_", " ")


#: Levels a case can get without a verdict of the black-box tool (the engine did not produce its completions).
ENGINE_LEVELS = (Level.REFUSED, Level.ENGINE_ERROR, Level.LOAD_ERROR, Level.TIMEOUT, Level.NOT_RUN)


@dataclass
class Check:
    """A check beside a case's law: ``passed`` (None: could not be checked, said in ``text``) and what it saw."""

    passed: bool | None
    text: str
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"passed": self.passed, "text": self.text, **self.detail}


def _plain(value):
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass
class CaseVerdict:
    """One case of one configuration: its level and headline, the completions the verdict read (``n``) and the
    procedure's power, where its law first departs, its looks, and the checks beside the law."""

    level: Level
    headline: str
    prompt: list[int]
    settings: str
    model: str
    n: int = 0
    power: float | None = None
    detects: float | None = None
    departure: str | None = None
    looks: dict | None = None  # the planned looks: the lines read, the deciding look, the looks taken
    generated: int | None = None  # completions the engine generated for the case (all waves)
    waves: list | None = None
    file: str | None = None
    replay: str | None = None  # the black-box tool's command reproducing the verdict
    replay_command: str | None = None  # the engine-level replay (a failing case)
    report: str | None = None
    call_seconds: float | None = None
    explained: str | None = None
    impossible: dict | None = None
    engine: dict | None = None  # the worker's record of a case the engine produced nothing for
    speculation: Check | None = None
    identity: Check | None = None
    seeds: Check | None = None
    condition: Check | None = None  # a serving condition's evidence, read from the engine
    rounds: Check | None = None  # a condition case's per-request rounds against those rebuilt from its completions
    logprobs: Check | None = None  # the returned log-probabilities against the exact values (a case that asks)
    samples: Check | None = None  # n > 1 completions per request: how often all n are the same (descriptive)
    twin: Check | None = None  # a case repeating another's seeds (streamed vs not): per seed the same ids and text
    text: Check | None = None  # a case that asks for the text: returned texts unlike their tokens' rendering, by pattern
    law_level: Level | None = None  # the law's level when another check (speculation) set the case's

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def failed(self) -> bool:
        return self.level in (Level.NOT_CERTIFIED, Level.NOT_SPECULATING, Level.NOT_REACHED)

    def as_dict(self) -> dict:
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}
        out["prompt_len"] = self.prompt_len
        return out


@dataclass
class ConfigVerdict:
    """One configuration's cases, and its efficiency and rounds checks (dicts of :mod:`.efficiency` / :mod:`.rounds`)."""

    note: str
    scheme: str | None
    method: str | None
    worker_wall_s: float | None = None
    failure: str | None = None
    cases: dict[str, CaseVerdict] = field(default_factory=dict)
    efficiency: dict | None = None
    rounds: dict | None = None

    def as_dict(self) -> dict:
        out = {"note": self.note, "scheme": self.scheme, "method": self.method, "worker_wall_s": self.worker_wall_s,
               "cases": {name: c.as_dict() for name, c in self.cases.items()}, "efficiency": self.efficiency}
        if self.failure:
            out["failure"] = self.failure
        if self.rounds is not None:
            out["rounds"] = self.rounds
        return out
