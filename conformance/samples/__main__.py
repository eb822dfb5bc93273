"""``python -m conformance.samples``: run the command line (:mod:`conformance.samples.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
