"""`python -m t2mlr.training train ...`: the training subcommands without the package's main CLI."""

import sys

from t2mlr.training.commands import main

sys.exit(main())
