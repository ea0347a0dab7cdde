"""`python -m workbench.cli …`: the same as the `verl-workbench` console script."""

import sys

from . import main

sys.exit(main())
