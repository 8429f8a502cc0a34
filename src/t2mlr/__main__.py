"""`python -m t2mlr ...` (and `torchrun -m t2mlr train ...`) runs the command line."""

import sys

from t2mlr.cli import main

sys.exit(main())
