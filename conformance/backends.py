"""Finding the backend under test: the one loader used by the plugin, ``run_checks``, replays and the benchmarks.

A backend spec is ``package.module:factory`` (the factory is called with no arguments; an
object that already has ``capabilities`` is used as it is) or a name registered by an installed
package under the entry-point group :data:`ENTRY_POINT_GROUP`. With no spec, the environment
variable :data:`ENV_BACKEND` is read, then :data:`DEFAULT_BACKEND`. The loaded object is checked
against :func:`specdec_ref.contract.check_backend`: a claimed capability without its method is
an error here, naming the method, not a confusing failure later.
"""
from __future__ import annotations

import importlib
import os

#: The backend certified when none is named: specdec_ref's own.
DEFAULT_BACKEND = "specdec_ref.backend:reference_backend"
#: Environment variable naming the backend when no option does.
ENV_BACKEND = "SPECDEC_BACKEND"
#: Entry-point group under which packages register backend factories by name.
ENTRY_POINT_GROUP = "specdec_ref.backends"


class BackendLoadError(ValueError):
    """The spec does not name a loadable backend, or the backend breaks the contract's declarations."""


def resolve_spec(spec: str | None = None) -> str:
    """``spec``, else ``$SPECDEC_BACKEND``, else :data:`DEFAULT_BACKEND`."""
    return spec or os.environ.get(ENV_BACKEND) or DEFAULT_BACKEND


def registered_backends() -> dict:
    """Backend factories registered by installed packages under :data:`ENTRY_POINT_GROUP` (name -> entry point)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_backend(spec: str | None = None):
    """Resolve ``spec`` (see the module docstring), build the backend and check its declarations.

    Raises :class:`BackendLoadError` with a message that names the spec and what is wrong.
    """
    from specdec_ref.contract import ContractError, check_backend

    spec = resolve_spec(spec)
    module_name, sep, attr = spec.partition(":")
    if not sep:
        registered = registered_backends()
        if spec not in registered:
            raise BackendLoadError(
                f"backend {spec!r} is neither 'package.module:factory' nor a registered backend name; "
                f"registered ({ENTRY_POINT_GROUP}): {', '.join(sorted(registered)) or 'none'}"
            )
        module_name, _, attr = registered[spec].value.partition(":")
    if not module_name or not attr:
        raise BackendLoadError(f"backend spec must look like 'package.module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendLoadError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise BackendLoadError(f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}")
    backend = factory() if callable(factory) and not hasattr(factory, "capabilities") else factory
    try:
        check_backend(backend)
    except ContractError as exc:
        raise BackendLoadError(f"backend {spec!r}: {exc}") from None
    return backend
