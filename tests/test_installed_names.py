"""The installed distribution claims only its own top-level names, and loses no module on the way.

The repository's folders ``properties/``, ``fixtures/`` and ``bench/`` install as ``specdec_properties``,
``specdec_fixtures`` and ``specdec_bench`` (pyproject.toml's ``package-dir``, setup.py): a generic top-level name is
someone else's (PyPI's ``fixtures`` is a dependency of testtools-based suites), and two distributions writing one
folder of site-packages overwrite each other's files. Guards: a packaging change that installs a folder under its
own generic name again, or drops a module or a data file (a replay, an expectation file, a stage script, a
checkpoint) from the wheel that a non-editable install gets.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from test_layout import PACKAGES, ROOT

#: what the wheel may hold at its top level: the five packages under their installed names and its metadata
ALLOWED_TOP_LEVEL = {"specdec_ref", "conformance", "specdec_properties", "specdec_fixtures", "specdec_bench"}


def build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """The wheel built from a copy of the tracked sources (setuptools writes ``build/`` beside them: not the repo's)."""
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, tracked.split("\0")):
        if name.split("/")[0] in {*PACKAGES.values(), "pyproject.toml", "setup.py", "README.md"}:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (wheel,) = (tmp_path / "dist").glob("specdec_ref-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_installs_each_folder_under_its_prefixed_name_and_nothing_generic(tmp_path):
    names = build_wheel(tmp_path).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == ALLOWED_TOP_LEVEL, f"the wheel's top-level names are {sorted(top)}, expected {sorted(ALLOWED_TOP_LEVEL)}"
    assert set(PACKAGES) == ALLOWED_TOP_LEVEL
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    missing = []
    for package, folder in PACKAGES.items():
        tracked = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
        for name in tracked.stdout.split():
            if name.endswith((".py", ".json", ".sh", ".safetensors")) and "/tests/" not in name:
                installed = package + name[len(folder):]
                if installed not in names:
                    missing.append(f"{name} (as {installed})")
    assert not missing, "tracked files the wheel does not install:\n  " + "\n  ".join(missing)
    assert top_level  # the metadata lists the names pip will claim


def test_the_renamed_folders_are_not_importable_under_their_folder_names():
    """Outside the repository, the installed environment (the editable install included) imports
    ``specdec_fixtures`` from ``fixtures/`` and never resolves ``fixtures`` there: that name stays free for PyPI's."""
    code = ("import importlib.util, json, specdec_fixtures, specdec_properties, specdec_bench\n"
            "found = {n: importlib.util.find_spec(n) for n in ('fixtures', 'properties', 'bench')}\n"
            "print(json.dumps({n: [s.origin, list(s.submodule_search_locations or [])] for n, s in found.items() if s}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = {name: where for name, where in json.loads(done.stdout).items() if str(ROOT) in json.dumps(where)}
    assert not ours, f"the repository's folders resolve under their generic names: {ours}"
