"""``python -m beliefscope`` runs the command line."""

import sys

from beliefscope.cli import main

sys.exit(main())
