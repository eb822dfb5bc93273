"""The shared engine runner: certify any registered engine from its outputs.

    python -m conformance.engines ENGINE --out DIR [--configs a,b] [--cases x,y] [--conditions all|c,d] [--patch A]
                                         [--scale F] [--check-expected] [--record-expected] [--timeout S] [--jobs N]

For every configuration of the engine's adapter (:mod:`conformance.engines.adapter`) and every target family it
needs, a worker process (:mod:`conformance.engines.worker`, run with the adapter's interpreter, fresh or forked from its
warm one (:mod:`conformance.engines.launch`), in its own process group, with a timeout: a crash or a hang is that
configuration's named failure, never the runner's) loads the
engine and writes one JSONL per case (``--jobs N``: N workers at a time, the largest first by
:meth:`~conformance.engines.adapter.EngineAdapter.work_estimate`; the verdicts do not depend on N); this process
then, the same for every engine:

* certifies each case with :func:`conformance.samples.certify_samples` under the engine's declared conventions
  (its top-k tie rule is part of the case's settings);
* localises a departure (the first token alone, then the tool's per-position transition tests);
* checks that a speculative configuration speculated (the engine's counters, or its per-request counters, show
  drafted tokens for the case's batch); one that drafted nothing is ``not_speculating``, never a pass;
* compares the acceptance counters with the exact expectation of the declared scheme
  (:mod:`conformance.engines.efficiency`);
* for a configuration that declares its argmax proposer, rebuilds every round of the efficiency set from the
  completions and compares them with the engine's counters, exactly (:mod:`conformance.engines.rounds`);
* for a serving condition's case (``--conditions``: :mod:`conformance.engines.conditions`), checks the evidence the
  engine reports that it reached the condition (a case that did not is ``NOT REACHED``) and, for an argmax proposer,
  every request's rounds against those rebuilt from its completion;
* checks per-seed identity where a configuration claims it (``identical_to``): request by request, naming the
  first request and position that differ;
* where the engine declares per-request seeds (and its adapter runs the probe), checks that seeded requests give the
  same completions in another batch (:mod:`conformance.engines.seeds`);
* writes ``DIR/verdicts.json``, ``DIR/verdicts.md`` and, per failing case, a replay (the adapter's standalone
  script, else the command that reruns the one case), and with ``--check-expected`` exits 1 when an outcome differs
  from ``conformance/engines/expected/<engine>-<version>.json`` (or our tooling errored), 0 when the engine fails
  as recorded; 2 when the engine is not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from .adapter import REPO, EngineMissingError, adapter as get_adapter
from .conditions import condition, condition_cases, evidence_check, per_request_evidence, under
from .features import apply_logprobs_check, apply_text_checks, copies_note
from .matrix import EFFICIENCY
from .rounds import case_rounds, rounds_of
from .sampled_rounds import sampled_case_rounds, sampled_rounds_of
from .seeds import identity_check
from .launch import run_worker, warm
from .waves import WaveDriver, case_looks
from .report import TOOL_ERROR, check_expected, expectation_entries, markdown, merge_expected, patch_key, write_json
from .verdict import ENGINE_LEVELS, CaseVerdict, Check, ConfigVerdict, Level

__all__ = ["run", "main", "certify_case", "speculation_check", "efficiency_of"]

REPLAY_N = 6000


def _run_family(ad, python: str, cfg_name: str, raw: Path, family: str, *, patch: str, scale: float, timeout: float,
                cases: str = "", engine: str | None = None, cpus: tuple[int, ...] | None = None,
                one_case_per_batch: bool = False) -> dict:
    """One worker for one target family, in waves; cases lost to an engine crash are rerun once, one batch each.
    ``one_case_per_batch`` (speculative configurations only): the worker runs the rerun's way from the start, one
    batch per case, the cases without top-k or top-p first; its cases are rerun only when the engine died before the
    first of them (in the efficiency set)."""
    engine = engine or ad.name
    cfg = ad.config(cfg_name)
    wanted = set(cases.split(",")) if cases else None
    split = one_case_per_batch and cfg.speculative

    def driver(names=None) -> WaveDriver:
        mine = [_under_conventions(ad, c) for c in ad.cases_for(cfg) if c.group == family
                and (wanted is None or c.name in wanted) and (names is None or c.name in names)]
        return WaveDriver(mine, raw, scale * cfg.scale, one_at_a_time=split or names is not None)

    state = run_worker(engine, python, cfg_name, raw, patch=patch, family=family, scale=scale, timeout=timeout,
                        cases=cases, split=split, driver=driver(), cpus=cpus)
    crashed = [n for n, c in state["cases"].items() if c.get("status") in ("engine_error", "not_run")]
    if split and any(state["cases"][n].get("status") != "not_run" for n in crashed):
        crashed = []  # one batch per case already: the crash is its case's, the cases after it not run
    if crashed and not state.get("error", "").startswith("setup"):
        print(f"  [{cfg_name}/{family}] engine failed on {crashed}: rerunning them one batch each", flush=True)
        first = {n: dict(state["cases"][n]) for n in crashed}
        (raw / "worker.json").rename(raw / "worker-first.json")
        retry = run_worker(engine, python, cfg_name, raw, patch=patch, family=family, cases=",".join(crashed),
                            split=True, scale=scale, timeout=timeout, driver=driver(set(crashed)), cpus=cpus)
        for n in crashed:
            c = retry["cases"].get(n, {"status": "not_run"})
            c["first_call"] = first[n]
            state["cases"][n] = c
            state["verdicts"].pop(n, None)
            if n in retry["verdicts"]:
                state["verdicts"][n] = retry["verdicts"][n]
        state["retry"] = {k: retry.get(k) for k in ("rc", "timed_out", "wall_s", "error", "waves")}
        (raw / "worker.json").rename(raw / "worker-retry.json")
        (raw / "worker-first.json").rename(raw / "worker.json")
    return state


def families_of(ad, cfg_name: str, cases: tuple[str, ...] = ()) -> list[str]:
    """The worker groups a configuration runs (one worker each): its target families, the efficiency set's first, then
    one ``family@condition`` per serving condition it runs (:attr:`conformance.engines.matrix.Case.group`)."""
    cfg = ad.config(cfg_name)
    mine = [c for c in ad.cases_for(cfg) if (c.name in cases if cases else c.condition is None)]
    families = [f for f in ad.families if any(c.group == f for c in mine)]
    if cfg.speculative and cfg.efficiency and not cases and EFFICIENCY.family not in families:
        families.insert(0, EFFICIENCY.family)
    return families + list(dict.fromkeys(c.group for c in mine if c.condition is not None))


def run_families(ad, python: str, jobs: list[tuple[str, str]], out: Path, *, patch: str, scale: float, timeout: float,
                 cases: tuple[str, ...] = (), engine: str | None = None, parallel: int = 1,
                 on_done=None, one_case_per_batch: bool = False) -> dict[tuple[str, str], dict]:
    """The worker state of every ``(configuration, family)`` job, ``parallel`` workers at a time (each its own process
    and process group, its own raw folder; a job's crash rerun stays inside the job). The result does not depend on
    ``parallel``: the jobs share nothing but the machine (the worker's timeout is per job). An adapter that pins its
    workers (:attr:`~conformance.engines.adapter.EngineAdapter.pin_workers`) gets, per running job, its own share of
    the CPUs this process may use."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    shares = [tuple(mine[i::parallel]) for i in range(parallel)] if ad.pin_workers and parallel > 1 and \
        len(mine) >= parallel else [None] * parallel
    free = queue.Queue()
    for share in shares:
        free.put(share)

    def one(job):
        cfg_name, fam = job
        share = free.get()
        try:
            st = _run_family(ad, python, cfg_name, out / "raw" / cfg_name / fam, fam, patch=patch, scale=scale,
                             timeout=timeout, cases=",".join(cases), engine=engine, cpus=share,
                             one_case_per_batch=one_case_per_batch)
        finally:
            free.put(share)
        if on_done is not None:
            on_done(job, st)
        return job, st

    if parallel <= 1:
        return dict(one(j) for j in jobs)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return dict(pool.map(one, jobs))


def merge_families(cfg_name: str, out: Path, states: dict[str, dict]) -> dict:
    """A configuration's state from its families' worker states (in family order); case files stay under
    ``out/raw/<config>/<family>/``."""
    merged = {"cases": {}, "families": {}, "efficiency": None, "wall_s": 0.0}
    errors = []
    for fam, st in states.items():
        raw = out / "raw" / cfg_name / fam
        for name, c in st["cases"].items():
            merged["cases"][name] = {**c, "dir": str(raw)}
            if name in (st.get("verdicts") or {}):
                merged["cases"][name]["verdict"] = st["verdicts"][name]  # the waves' own (never written to JSON)
        merged["families"][fam] = st.get("families", {}).get(fam, {})
        merged["efficiency"] = merged["efficiency"] or st.get("efficiency")
        merged["wall_s"] += st.get("wall_s") or 0.0
        merged.setdefault("version", st.get("version"))
        if st.get("error"):
            errors.append(f"{fam}: {st['error']}")
    if errors:
        merged["error"] = "; ".join(errors)
    return merged


def run_configuration(ad, python: str, cfg_name: str, out: Path, *, patch: str, scale: float, timeout: float,
                      cases: tuple[str, ...] = (), engine: str | None = None, one_case_per_batch: bool = False) -> dict:
    """A fresh worker process per target family, one after the other; their states merged."""
    fams = families_of(ad, cfg_name, cases)
    states = run_families(ad, python, [(cfg_name, f) for f in fams], out, patch=patch, scale=scale, timeout=timeout,
                          cases=cases, engine=engine, one_case_per_batch=one_case_per_batch)
    return merge_families(cfg_name, out, {f: states[(cfg_name, f)] for f in fams})


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
    from conformance.samples import certify_samples

    if rec["level"] != "not_certified" or case.greedy:
        if case.greedy and rec.get("divergences"):
            d = rec["divergences"][0]
            return f"greedy divergence at position {d.get('position', '?')}"
        return None
    cut = []
    for line in path.read_text().splitlines()[: rec["n"]]:  # the lines the verdict read
        r = json.loads(line)
        cut.append({"prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"][:1], "seed": r["seed"],
                    "index": r.get("index")})
    first = certify_samples(cut, model=case.model, sampling=case.sampling, max_new_tokens=1,
                            eos_id=True if case.eos else None, stop=case.stop_rule(),
                            pool_prompts=case.pooled).as_record()
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


def certify_case(case, state: dict, scale: float = 1.0) -> CaseVerdict:
    """The black-box verdict of one case's completions (``case.sampling`` is already under the engine's conventions),
    at the case's planned looks (:func:`conformance.engines.waves.case_looks` at ``scale``): the waves' own verdict
    when they decided it, else the same certification of its file."""
    from conformance.samples import SamplesInputError, certify_samples

    info = state["cases"].get(case.name, {"status": "not_run"})
    base = dict(prompt=list(case.prompt), settings=case.settings(), model=case.model)
    if info.get("status") != "ok":
        status = info.get("status", "not_run")
        level = Level(status) if status in {x.value for x in ENGINE_LEVELS} else Level.ENGINE_ERROR
        return CaseVerdict(level, f"{level.words}: {info.get('error', '')}"[:200], **base,
                           engine={k: v for k, v in info.items() if k != "verdict"})
    path = Path(info["dir"]) / info["file"]
    try:
        verdict = info.get("verdict") or certify_samples(
            str(path), model=case.model, sampling=case.sampling, max_new_tokens=case.max_new_tokens,
            eos_id=True if case.eos else None, looks=case_looks(case, scale), stop=case.stop_rule(),
            pool_prompts=case.pooled)
        rec = verdict.as_record()
        power, detects = _fit_summary(rec)
        imp = rec.get("impossible") or {}
        return CaseVerdict(
            Level(rec["level"]), rec["headline"], **base, n=rec["n"], power=power, detects=detects,
            departure=_departure(case, path, rec), file=str(path), replay=rec["replay"],
            call_seconds=info.get("call_seconds"), report=verdict.report(), looks=_looks_summary(rec),
            generated=info.get("n"), waves=info.get("waves"), explained=rec.get("explained"),
            # tokens of probability 0: counted per completion, request and position, and by the declared rule that
            # forbids them (the grammar, the bad words) where one does
            impossible={k: imp.get(k) for k in ("completions", "requests", "by_position", "forbidden_by")}
            if imp.get("completions") else None)
    except SamplesInputError as exc:  # the file itself is unusable (ids outside the vocabulary...): the engine's
        return CaseVerdict(Level.NOT_CERTIFIED, f"NOT CERTIFIED: invalid engine output: {exc}"[:300], **base)
    except Exception as exc:  # noqa: BLE001 - our tooling failed: never an expected outcome
        return CaseVerdict(Level.TOOL_ERROR, f"TOOL ERROR: {type(exc).__name__}: {exc}"[:300], **base)


def _looks_summary(rec: dict) -> dict | None:
    """What a case's record states of its looks: the lines the decision read, where it was decided, the looks taken,
    the planned full look and the family-wise alpha of all of them."""
    seq = rec.get("sequential")
    if not seq:
        return None
    return {"n_used": seq["n_used"], "look": seq["look"], "outcome": seq["outcome"], "decided": seq["decided"],
            "taken": [[x["kind"], x["n"], x["outcome"]] for x in seq["taken"]], "full_n": seq["plan"]["full_n"],
            "family_alpha": rec.get("family_alpha"), "text": seq["summary"]}


def speculation_check(cfg, case, info: dict) -> Check | None:
    """Did the engine speculate for this case? From its per-request counters for the case, else its counters over
    the batch that held the case. ``passed`` False: it drafted nothing (a silent fall-back to plain sampling);
    None: the engine reports no counters (unverified, stated)."""
    if not cfg.speculative or info.get("status") != "ok" or case.max_new_tokens < 2:
        return None
    per_case, call = info.get("case_counters"), info.get("call_counters")
    if per_case is not None:
        drafted, source = int(per_case.get("draft_tokens") or 0), "per-request counters of this case"
        without = per_case.get("requests_without_drafts")
    elif call is not None:
        drafted, source, without = int(call.get("draft_tokens") or 0), "counters over the batch holding it", None
    else:
        return Check(None, "unverified: the engine reports no speculative counters")
    text = f"{drafted} draft tokens ({source})" + (f"; {without} requests drafted nothing" if without else "")
    return Check(drafted > 0, text, {"draft_tokens": drafted, "requests_without_drafts": without})


def efficiency_of(ad, cfg, state: dict) -> dict | None:
    from .efficiency import compare, expectation_for

    eff = state.get("efficiency")
    if not cfg.speculative or eff is None:
        return None
    if eff.get("status") != "ok":
        return {"scheme": cfg.scheme, "passed": False, "verdict": f"efficiency request set failed: {eff.get('error')}"}
    k = ad.k_of(cfg)
    rates = cfg.options.get("synthetic_acceptance_rates") if cfg.scheme == "synthetic" else None
    exp = None
    if cfg.scheme in ("token", "one_hot", "block", "sample_match") and (cfg.proposer or "draft") == "draft" \
            and cfg.sampled_proposer is None:
        exp = expectation_for(ad.families[EFFICIENCY.family], cfg.scheme, EFFICIENCY.sampling.temperature, k,
                              tuple(eff["prompts_last"]), EFFICIENCY.max_new_tokens,
                              prefill=ad.conventions.first_token_at_prefill)
    out = compare(eff, exp, k=k, rates=rates)
    out.update(scheme=cfg.scheme, n_requests=eff["n"], seconds=eff.get("seconds"),
               counters_source=eff.get("counters_source"))
    return out


def write_replay(ad, out: Path, cfg, case, c: CaseVerdict, patch: str, engine: str | None = None) -> str | None:
    """The replay of a failing sampling case: the adapter's standalone script, else the command rerunning it (also for a
    condition case whose rounds differ)."""
    from scipy.stats import chi2

    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    rounds_failed = c.rounds is not None and c.rounds.passed is False
    if not (c.failed or rounds_failed) or (case.greedy and not rounds_failed):
        return None
    name = f"{cfg.name}-{case.name}" + (f"-patch{patch.replace(',', '')}" if patch else "")
    rerun = ["python", "-m", "conformance.engines", engine or ad.name, "--out", str(out / "replay" / name),
             "--configs", cfg.name, "--cases", case.name] + (["--patch", patch] if patch else [])
    logprobs_only = c.logprobs is not None and c.logprobs.passed is False and c.law_level in (Level.CERTIFIED, Level.REDUCED)
    if (len(case.prompts) > 1 or not c.failed or c.level is Level.NOT_REACHED or logprobs_only or case.texts
            or case.sampling.constraint is not None or case.sampling.bad_words):
        # the standalone scripts replay one prompt's law, token ids only
        return " ".join(shlex.quote(a) for a in rerun)
    dep = c.departure or ""
    length = 1 if dep.startswith("position 1 ") else case.max_new_tokens
    if dep.startswith("position ") and not dep.startswith("position 1 "):
        length = int(dep.split()[1].rstrip(":"))
    em = exact_model(case.model)
    law = continuation_law(em, list(case.prompt), length, case.sampling, eos_id=int(em.eos_id) if case.eos else None)
    law = {" ".join(map(str, k)): float(v) for k, v in law.items()}
    cells = sum(1 for v in law.values() if v * REPLAY_N >= 20) + 1
    path = out / "replay" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = ad.replay(cfg, case, patch=patch, departure=dep, length=length, law=law, n=REPLAY_N,
                    critical=float(chi2.isf(1e-6, max(cells - 1, 1))), path=path)
    return cmd or " ".join(shlex.quote(a) for a in rerun)


def _apply_checks(ad, cfg, case, state: dict, c: CaseVerdict) -> None:
    from .seeds import seed_check

    info = state["cases"].get(case.name, {})
    probe = info.get("seed_probe")
    if probe is not None:
        c.seeds = seed_check(probe) if "error" not in probe else Check(False, f"seed probe: {probe['error']}")
    if case.condition is not None and c.level not in ENGINE_LEVELS:
        try:
            rounds = (sampled_case_rounds if cfg.sampled_proposer else case_rounds)(ad, cfg, case, info)
        except Exception as exc:  # noqa: BLE001 - our tooling failed on this case: named, never the runner's crash
            c.level, c.headline = Level.TOOL_ERROR, f"TOOL ERROR: rounds check: {type(exc).__name__}: {exc}"[:300]
            return
        if rounds is not None and rounds.get("passed") is not None:
            c.rounds = Check(rounds["passed"], rounds["text"],
                             {"proposer": cfg.proposer or f"sampled {cfg.sampled_proposer}"})
        lines = map(json.loads, (Path(info["dir"]) / info["file"]).read_text().splitlines()) if info.get("file") else ()
        reached, text = evidence_check(under(condition(case.condition), cfg.condition_settings), case,
                                       info.get("evidence"), per_request_evidence(lines), absent=ad.absent_knobs)
        c.condition = Check(reached, text, {"evidence": info.get("evidence")})
        if not reached:
            c.law_level, c.level = c.level, Level.NOT_REACHED
            c.headline = f"NOT REACHED: {case.condition}: {text}; the law alone: {c.headline}"[:300]
    if case.logprobs and c.level not in ENGINE_LEVELS and c.level is not Level.TOOL_ERROR:
        apply_logprobs_check(ad, cfg, case, info, c)
    if case.samples > 1 and c.level not in ENGINE_LEVELS and info.get("file"):
        c.samples = copies_note(case, Path(info["dir"]) / info["file"])
        if c.level is Level.NOT_CERTIFIED and c.samples.detail.get("copies_explain"):
            c.explained = c.samples.text
    if case.texts and c.level not in ENGINE_LEVELS and info.get("file"):
        apply_text_checks(ad, case, state, c)
    spec = speculation_check(cfg, case, info)
    if spec is not None:
        c.speculation = spec
        if spec.passed is False and c.level is not Level.NOT_REACHED:
            c.law_level, c.level = c.level, Level.NOT_SPECULATING
            c.headline = (f"NOT SPECULATING: {spec.text}; the law alone: {c.headline}")[:300]


def identity_order(ad, names: list[str]) -> list[str]:
    """``names`` with every configuration after those it claims to equal per seed (``identical_to``,
    ``condition_identical_to``), otherwise in the given order: their states must exist when it is certified."""
    out: list[str] = []

    def place(n: str, seen: tuple[str, ...] = ()) -> None:
        if n in out:
            return
        if n in seen:
            raise ValueError(f"configurations claim per-seed identity in a circle: {' -> '.join(seen + (n,))}")
        cfg = ad.config(n)
        for other in (cfg.identical_to, cfg.condition_identical_to):
            if other in names:
                place(other, seen + (n,))
        out.append(n)

    for n in names:
        place(n)
    return out


def run(args) -> dict:
    """Run the workers (forked from a warm interpreter where the adapter preloads: :mod:`.launch`), certify, report."""
    ad = get_adapter(args.engine)
    python = ad.python()
    out = Path(args.out).resolve()  # the workers run in the repository: a relative --out means the caller's directory
    out.mkdir(parents=True, exist_ok=True)
    with warm(ad, args.engine, python, REPO, out / "zygote.log"):
        return _run(args, ad, python, out)


def _run(args, ad, python: str, out: Path) -> dict:
    names = args.configs.split(",") if args.configs else [c.name for c in ad.configurations]
    only = tuple(x for x in (args.cases or "").split(",") if x)
    for n in names:
        ad.config(n)
    conditions = getattr(args, "conditions", "") or ""
    if conditions:  # the named serving conditions' cases only, on the configurations that run them
        chosen = tuple(ad.conditions) if conditions == "all" else tuple(conditions.split(","))
        unknown = sorted(set(chosen) - set(ad.conditions))
        if unknown:
            raise KeyError(f"{ad.name} runs no condition {', '.join(unknown)}; it runs: {', '.join(ad.conditions)}")
        only += tuple(c.name for c in condition_cases(chosen))
        names = [n for n in names if any(c.name in only for c in ad.cases_for(ad.config(n)))]
    names = identity_order(ad, [n for n in names if families_of(ad, n, only)])  # those with something to run
    t0 = time.time()
    results = {"engine": ad.name, "title": ad.title, "pinned": ad.version,
               "command": " ".join(shlex.quote(a) for a in ["python", "-m", "conformance.engines", args.engine, *args.argv]),
               "patch": args.patch, "patch_key": patch_key(args.patch), "scale": args.scale, "configs": {},
               "conventions": {"top_k_ties": ad.conventions.top_k_ties, "seeds": ad.conventions.seeds,
                               "first_token_at_prefill": ad.conventions.first_token_at_prefill,
                               "notes": list(ad.conventions.notes)}}
    states = {}
    jobs = max(1, int(getattr(args, "jobs", 1) or 1))
    split = bool(getattr(args, "one_case_per_batch", False))
    timeout = args.timeout or ad.timeout_s * (1 + 0.5 * (jobs - 1))  # a worker shares the machine with jobs - 1 others
    if jobs > 1:  # every worker first, longest first by the adapter's estimate; then the verdicts in order
        work = [(n, f) for n in names for f in families_of(ad, n, only)]
        print(f"[{time.time() - t0:5.0f}s] {len(work)} workers, {jobs} at a time", flush=True)
        worker_states = run_families(
            ad, python, sorted(work, key=lambda j: -ad.work_estimate(*j)), out, patch=args.patch, scale=args.scale,
            timeout=timeout, cases=only, engine=args.engine, parallel=jobs, one_case_per_batch=split,
            on_done=lambda job, st: print(f"[{time.time() - t0:5.0f}s]   worker {job[0]}/{job[1]} done in "
                                          f"{st.get('wall_s', 0):.0f} s", flush=True))
    for n in names:
        cfg = ad.config(n)
        print(f"[{time.time() - t0:5.0f}s] {n}: {cfg.note}", flush=True)
        if jobs > 1:
            fams = families_of(ad, n, only)
            state = merge_families(n, out, {f: worker_states[(n, f)] for f in fams})
        else:
            state = run_configuration(ad, python, n, out, patch=args.patch, scale=args.scale, timeout=timeout,
                                      cases=only, engine=args.engine, one_case_per_batch=split)
        states[n] = state
        results["version"] = results.get("version") or state.get("version")
        entry = ConfigVerdict(cfg.note, cfg.scheme, cfg.method, worker_wall_s=state.get("wall_s"),
                              failure=state.get("error"))
        for case in ad.cases_for(cfg):
            if (only and case.name not in only) or (not only and case.condition is not None):
                continue
            case = _under_conventions(ad, case)
            c = certify_case(case, state, args.scale * cfg.scale)
            _apply_checks(ad, cfg, case, state, c)
            same = cfg.condition_identical_to if case.condition is not None and cfg.condition_identical_to \
                else cfg.identical_to
            if same and same in states:
                c.identity = identity_check(case, state, states[same], same)
            if c.failed or (c.rounds is not None and c.rounds.passed is False):
                c.replay_command = write_replay(ad, out, cfg, case, c, args.patch, args.engine)
            entry.cases[case.name] = c
            look = (c.looks or {}).get("look")
            print(f"    {case.name:14s} N={c.n:6d} {'(' + look + ')' if look else '':12s} {c.headline[:110]}" +
                  (f"  [departs: {c.departure}]" if c.departure else "") +
                  (f"  [identity: {c.identity.text[:80]}]" if c.identity else "") +
                  (f"  [{c.seeds.text[:160]}]" if c.seeds and c.seeds.passed is False else "") +
                  (f"  [condition: {c.condition.text[:100]}]" if c.condition else "") +
                  (f"  [rounds: {c.rounds.text[:200]}]" if c.rounds else ""), flush=True)
        entry.efficiency = efficiency_of(ad, cfg, state)
        rounds = rounds_of(ad, cfg, state)  # argmax drafts: the rounds rebuilt from the completions vs the counters
        if rounds is not None:
            entry.rounds = rounds["check"]
            entry.efficiency = rounds["efficiency"] or entry.efficiency
            print(f"    rounds: {rounds['check']['text'][:300]}", flush=True)
        sampled = sampled_rounds_of(ad, cfg, state)  # sampled drafts: acceptance given the engine's own rounds
        if sampled is not None:
            entry.efficiency = sampled
        if entry.efficiency:
            print(f"    efficiency: {entry.efficiency['verdict']}", flush=True)
        results["configs"][n] = entry.as_dict()
        write_json(out / "verdicts.json", {**results, "wall_s": time.time() - t0})
    results["wall_s"] = time.time() - t0
    write_json(out / "verdicts.json", results)
    (out / "verdicts.md").write_text(markdown(results))
    print(f"matrix wall {results['wall_s']:.0f} s; wrote {out / 'verdicts.json'} and {out / 'verdicts.md'}", flush=True)
    return results


def _under_conventions(ad, case):
    return ad.conventions.under(case)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m conformance.engines", description=__doc__.split("\n")[0])
    ap.add_argument("engine", help="a registered engine (conformance.engines.adapter.ADAPTERS)")
    ap.add_argument("--out", required=True, help="output folder (JSONL per case, verdicts.json / .md, replays)")
    ap.add_argument("--patch", default="", help="the adapter's opt-in fixes to apply in the worker (e.g. vLLM's A or A,B)")
    ap.add_argument("--configs", default="", help="only these configurations (comma-separated)")
    ap.add_argument("--cases", default="", help="only these cases (comma-separated; no efficiency set)")
    ap.add_argument("--conditions", default="", help="run these serving conditions' cases instead of the matrix "
                    "(comma-separated, or all: conformance.engines.conditions), on the configurations that run them")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of every case's N (quick runs; verdicts then "
                    "lose power and --check-expected is refused)")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per worker (default: the adapter's, x 1.5 per "
                    "extra job)")
    ap.add_argument("--jobs", type=int, default=1, help="engine workers at a time (one per configuration and target "
                    "family; the verdicts do not depend on it; an engine whose workers use one core each gains most)")
    ap.add_argument("--one-case-per-batch", action="store_true", help="speculative configurations run one batch per "
                    "case from the start, the cases without top-k or top-p first (the crash rerun's way, nothing "
                    "rerun): for an engine whose mixed batches are known to crash (vLLM unpatched, defect A)")
    ap.add_argument("--check-expected", action="store_true", help="exit 1 unless every outcome is the recorded one")
    ap.add_argument("--record-expected", action="store_true", help="add this run's outcomes to the expectation file")
    args = ap.parse_args(argv)
    args.argv = argv[1:]
    if args.scale != 1.0 and (args.check_expected or args.record_expected):
        ap.error("--check-expected / --record-expected need the full sample sizes (--scale 1)")
    try:
        ad = get_adapter(args.engine)
        results = run(args)
    except (EngineMissingError, KeyError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    observed = expectation_entries(results)
    key = ad.expectation_key(patch_key(args.patch))
    path = ad.expected_path(results.get("version"))
    if args.record_expected:
        expected = json.loads(path.read_text()) if path.exists() else {}
        write_json(path, merge_expected(expected, key, observed, engine=ad.name, version=results.get("version") or "?"))
        print(f"recorded {key} in {path}")
    if args.check_expected:
        if not path.exists():
            print(f"EXPECTATION MISMATCH: no expectation file {path} for {ad.title} {results.get('version')} "
                  f"(pinned: {ad.version})", file=sys.stderr)
            return 1
        problems = check_expected(json.loads(path.read_text()), key, observed)
        if args.configs or args.cases:
            wanted = set(args.configs.split(",")) if args.configs else None
            problems = [p for p in problems if p.startswith("no ") or
                        ((wanted is None or p.split(" / ")[0] in wanted) and
                         (not args.cases or p.split(" / ")[1].split(":")[0] in args.cases.split(",")))]
        for p in problems:
            print(f"EXPECTATION MISMATCH: {p}", file=sys.stderr)
        print(f"expectations ({ad.name} {results.get('version')}, {key}): "
              f"{'as recorded' if not problems else f'{len(problems)} mismatch(es)'}")
        return 1 if problems else 0
    tool_errors = [f"{c}/{n}" for c, r in results["configs"].items() for n, x in r["cases"].items() if x["level"] == TOOL_ERROR]
    return 1 if tool_errors else 0
