"""``python -m linattn`` runs the ``linattn`` command."""

import sys

from linattn.cli import main

sys.exit(main())
