"""Installs the repository's top-level folders under the import names that pyproject.toml's ``package-dir`` gives them.

The folders ``properties/``, ``fixtures/`` and ``bench/`` keep their names in the repository (they show the
architecture); installed, they are ``specdec_properties``, ``specdec_fixtures`` and ``specdec_bench``, so that the
distribution never claims a generic top-level name another project owns (PyPI's ``fixtures``, a dependency of
testtools-based suites). The mapping itself lives in ``[tool.setuptools] package-dir``; this file only lists the
packages under their installed names, which ``[tool.setuptools.packages.find]`` cannot do (it names folders).
"""
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pyproject.toml's build requirements bring tomli
    import tomli as tomllib

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
FOLDERS = ["specdec_ref", "conformance", *PACKAGE_DIR.values()]


def installed_name(package: str) -> str:
    """``fixtures.mutants`` -> ``specdec_fixtures.mutants``: the folder part replaced by its installed name."""
    folder, dot, rest = package.partition(".")
    renamed = {folder_: name for name, folder_ in PACKAGE_DIR.items()}
    return renamed.get(folder, folder) + dot + rest


setup(packages=[installed_name(p) for p in find_namespace_packages(where=str(ROOT), include=[f"{f}*" for f in FOLDERS])
                if p.partition(".")[0] in FOLDERS])
