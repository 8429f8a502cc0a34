"""`python -m t2mlr.evaluation [lm-eval arguments]`: lm-eval's CLI with the "t2mlr" model (see harness)."""

import sys

from t2mlr.evaluation.harness import main

sys.exit(main())
