"""``python -m specdec_bench SUBCOMMAND ...``: the same as the ``specdec-bench`` command."""
import sys

from .cli import main

sys.exit(main())
