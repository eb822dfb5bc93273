"""Pure parts of the vLLM runner: outcome levels, the expectation file, the verdict table, the replay script.

No vLLM import. Invariant: :func:`check_expected` fails exactly when an observed level is outside the
recorded set for its (patch, configuration, case) or when the tooling itself errored; an outcome recorded
as nondeterministic (several levels) passes with any of them.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "ENGINE_LEVELS", "TOOL_ERROR", "patch_key", "expectation_entries", "check_expected", "merge_expected",
    "markdown", "replay_script",
]

#: Levels a case can get without a verdict of the black-box tool (the engine did not produce its completions).
ENGINE_LEVELS = ("refused", "engine_error", "load_error", "timeout", "not_run")
#: Our own tooling failed on the case (never an expected outcome).
TOOL_ERROR = "tool_error"


def patch_key(patch: str) -> str:
    """``""`` -> ``"unpatched"``; ``"b,a"`` -> ``"patch A,B"``."""
    names = sorted({p.strip().upper() for p in patch.split(",") if p.strip()})
    return "patch " + ",".join(names) if names else "unpatched"


def expectation_entries(results: dict) -> dict:
    """``{config: {case: level}}`` (plus ``efficiency``) from a run's ``verdicts.json`` data."""
    out = {}
    for cfg, r in results["configs"].items():
        row = {case: c["level"] for case, c in r["cases"].items()}
        eff = r.get("efficiency") or {}
        if eff.get("passed") is not None:
            row["efficiency"] = "pass" if eff["passed"] else "fail"
        out[cfg] = row
    return out


def merge_expected(expected: dict, key: str, observed: dict, *, version: str) -> dict:
    """Record ``observed`` under ``key``: levels seen in earlier recordings are kept, so an outcome seen with two
    levels becomes a list (nondeterministic)."""
    expected = json.loads(json.dumps(expected or {}))
    expected.setdefault("vllm", version)
    section = expected.setdefault("expected", {}).setdefault(key, {})
    for cfg, row in observed.items():
        dst = section.setdefault(cfg, {})
        for case, level in row.items():
            old = dst.get(case)
            seen = set(old if isinstance(old, list) else ([old] if old else []))
            seen.add(level)
            dst[case] = sorted(seen) if len(seen) > 1 else level
    return expected


def check_expected(expected: dict, key: str, observed: dict) -> list[str]:
    """Mismatches (empty: as recorded). Tool errors are always mismatches; a case missing from the record is one."""
    problems = []
    section = (expected or {}).get("expected", {}).get(key)
    if section is None:
        return [f"no expectation recorded for {key}"]
    for cfg, row in observed.items():
        for case, level in row.items():
            if level == TOOL_ERROR:
                problems.append(f"{cfg} / {case}: our tooling errored")
                continue
            want = section.get(cfg, {}).get(case)
            allowed = want if isinstance(want, list) else ([want] if want else [])
            if level not in allowed:
                problems.append(f"{cfg} / {case}: got {level}, recorded {want if want else 'nothing'}")
    return problems


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
    """The verdict table and the efficiency table of one run."""
    lines = [f"# vLLM {results.get('vllm', '?')} black-box verdicts ({results['patch_key']})", "",
             f"command: `{results['command']}`; wall {results['wall_s']:.0f} s", "",
             "| configuration | case | prompt | settings | N | power / detects TV >= | verdict | first departure | "
             "acceptance observed / exact |", "|---|---|---|---|---|---|---|---|---|"]
    for cfg, r in results["configs"].items():
        eff = r.get("efficiency") or {}
        acc = "-"
        if eff.get("acceptance_per_token") is not None:
            acc = f"{eff['acceptance_per_token']:.3f}"
            if eff.get("expected_acceptance_per_token") is not None:
                acc += f" / {eff['expected_acceptance_per_token']:.3f}"
        for case, c in r["cases"].items():
            power = "-" if c.get("power") is None else f"{c['power']:.3f} / {_fmt(c.get('detects'))}"
            verdict = c.get("headline") or c["level"]
            lines.append(f"| {cfg} | {case} | {c.get('prompt', '')} | {c.get('settings', '')} | {c.get('n', '-')} | "
                         f"{power} | {verdict} | {c.get('departure') or '-'} | {acc} |")
    lines += ["", "## Efficiency (vLLM's counters vs the exact expectation of the configured scheme)", "",
              "| configuration | scheme | drafts (exact E) | per position: observed / exact (z) | verdict |",
              "|---|---|---|---|---|"]
    for cfg, r in results["configs"].items():
        eff = r.get("efficiency")
        if not eff:
            continue
        pos = "; ".join(
            f"{p['position']}: {p['observed']:.4f}" + (f" / {p['expected']:.4f} ({p['z']:+.1f})" if "expected" in p else "")
            for p in eff.get("positions", []))
        lines.append(f"| {cfg} | {eff.get('scheme') or '-'} | {eff.get('drafts', '-')} ({_fmt(eff.get('expected_drafts'), '.0f')}) | "
                     f"{pos or '-'} | {eff.get('verdict', '-')} |")
    failures = [(cfg, r["failure"]) for cfg, r in results["configs"].items() if r.get("failure")]
    if failures:
        lines += ["", "## Configuration failures", ""] + [f"* {cfg}: {f}" for cfg, f in failures]
    return "\n".join(lines) + "\n"


_REPLAY = '''"""Replay: {title}

Standalone (vllm + numpy + the checkpoint folders). Exact law of the first {length} generated token(s) after
{prompt} embedded below (from the checkpoint's tables). Prints chi-square vs the critical value at alpha 1e-6.
Run: {command}
"""
import os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import collections
import numpy as np

{patch_code}
from vllm import LLM, SamplingParams

TARGET = {target!r}
SPEC = {spec!r}
PROMPT = {prompt!r}
PARAMS = {params!r}
N = {n}
LENGTH = {length}
EOS = {eos!r}
LAW = {law!r}
CRITICAL = {critical!r}


def main():
    llm = LLM(model=TARGET, speculative_config=SPEC, dtype="float32", enforce_eager=True, max_model_len=32, seed=0,
              max_num_seqs=1024, max_num_batched_tokens=8192)
    params = [SamplingParams(**dict(PARAMS, seed=(None if PARAMS.get("seed") is None else 7_000_000 + i)))
              for i in range(N)]
    outs = llm.generate([{{"prompt_token_ids": PROMPT}}] * N, params, use_tqdm=False)
    counts = collections.Counter()
    for o in outs:
        seq = []
        for t in o.outputs[0].token_ids[:LENGTH]:
            seq.append(int(t))
            if EOS is not None and t == EOS:
                break
        counts[" ".join(map(str, seq))] += 1
    keys = sorted(set(LAW) | set(counts))
    obs = np.array([counts[k] for k in keys], float)
    exp = np.array([LAW.get(k, 0.0) for k in keys]) * N
    impossible = {{k: counts[k] for k in keys if LAW.get(k, 0.0) == 0 and counts[k]}}
    big = exp >= 20
    chi = float((((obs - exp) ** 2 / np.where(exp > 0, exp, 1))[big]).sum())
    rest_o, rest_e = obs[~big].sum(), exp[~big].sum()
    if rest_e > 0:
        chi += (rest_o - rest_e) ** 2 / rest_e
    tv = 0.5 * np.abs(obs / N - exp / N).sum()
    print(f"N={{N}}, chi-square {{chi:.1f}} (critical {{CRITICAL:.1f}} at alpha 1e-6), TV {{tv:.3f}}, impossible {{impossible}}")
    order = np.argsort(-np.abs(obs - exp))[:8]
    for i in order:
        print(f"  {{keys[i]:>12}}: observed {{obs[i]:.0f}}, expected {{exp[i]:.1f}}")
    print("DEPARTS from the exact law" if chi > CRITICAL or impossible else "consistent with the exact law")


if __name__ == "__main__":
    main()
'''

_PATCH_A = '''import torch
import vllm.utils.cpu_triton_utils as cpu_tl


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    # the fix of defect A: expand request values to their draft tokens in the output's own dtype
    cu = cu_num_tokens.to(torch.int64)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    for r in range(input_val.shape[0]):
        v = input_val[r]
        v = torch.as_tensor(replace_to, dtype=input_val.dtype) if v == replace_from else v
        output[int(starts[r]):int(cu[r])] = v.to(output.dtype)


cpu_tl._expand_kernel_impl = _expand
'''

_PATCH_B = '''import vllm.v1.sample.ops.topk_topp_sampler as _tts
_orig_top_k_only = _tts.apply_top_k_only
_tts.apply_top_k_only = lambda logits, k: logits if logits.shape[0] == 0 or k.numel() == 0 else _orig_top_k_only(logits, k)
'''


def replay_script(*, title: str, command: str, target: str, spec, prompt, params: dict, n: int, length: int, eos,
                  law: dict, critical: float, patch: str) -> str:
    """A standalone script reproducing a departure: the case's requests against the installed vLLM, the first
    ``length`` tokens counted and compared with the embedded exact law (keys: space-separated ids)."""
    names = {p.strip().upper() for p in patch.split(",") if p.strip()}
    code = (_PATCH_A if "A" in names else "") + (_PATCH_B if "B" in names else "")
    return _REPLAY.format(title=title, command=command, target=target, spec=spec, prompt=list(prompt), params=params,
                          n=n, length=length, eos=eos, law=law, critical=critical,
                          patch_code=code or "# (unpatched vLLM)")


def write_json(path: Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
