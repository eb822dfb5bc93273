"""The command line that reproduces a black-box verdict (:func:`replay_command`).

Invariant: every setting the verdict was judged under is on the command line, so running it judges the same file
under the same law, at the same looks.
"""
from __future__ import annotations

import shlex

from specdec_ref.warp import SamplingConfig

from .conventions import TOP_K_TIES_CLI
from .law import SAMPLES_TV, extra_settings_on, setting_text
from .looks import Looks

__all__ = ["replay_command"]


def replay_command(model_name: str, sampling: SamplingConfig, *, max_new_tokens: int, eos: bool, length: int | None,
                   source: str, dtype: str | None = None, tv: float = SAMPLES_TV, tolerance: float | None = None,
                   looks: Looks | None = None, stop=None, pool_prompts: bool = False) -> str:
    """The command line that reproduces a verdict (``stop``: its :class:`specdec_properties.stops.StopStrings`)."""
    args = ["python", "-m", "conformance.samples", "--model", model_name]
    for flag, name, value in extra_settings_on(sampling):
        args += [flag, setting_text(value, name)]
    if sampling.greedy:
        args.append("--greedy")
        if tolerance is not None:
            args += ["--tolerance", f"{tolerance:g}"]
        elif dtype and dtype != "float32":
            args += ["--dtype", dtype]
    else:
        args += ["--temperature", f"{sampling.temperature:g}"]
        if sampling.top_k is not None:
            args += ["--top-k", str(sampling.top_k)]
        if sampling.top_k_ties != "all":
            args += ["--top-k-ties", TOP_K_TIES_CLI[sampling.top_k_ties]]
        if sampling.top_p is not None:
            args += ["--top-p", f"{sampling.top_p:g}"]
        if length is not None:
            args += ["--length", str(length)]
        if tv != SAMPLES_TV:
            args += ["--tv", f"{tv:g}"]
    args += ["--max-new-tokens", str(max_new_tokens)]
    if eos:
        args.append("--eos")
    if pool_prompts:
        args.append("--pool-prompts")
    if stop is not None:
        for string in stop.strings:
            args += [f"--stop={string}"]
        if stop.prefix:
            args += [f"--token-prefix={stop.prefix}"]
    if looks is not None:
        args += ["--looks"] if looks.whole_file else ["--planned-n", f"{looks.nominal_n:g}"]
    args.append(source)
    return shlex.join(args)
