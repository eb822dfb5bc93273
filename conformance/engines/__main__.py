"""``python -m conformance.engines ENGINE --out DIR [...]``: the shared runner (:mod:`conformance.engines.runner`)."""
import sys

from .runner import main

sys.exit(main())
