"""``python -m specdec_ref.exact build|check``: (re)write or verify the exactly-known checkpoint folders."""
import sys

from .checkpoints import main

sys.exit(main())
