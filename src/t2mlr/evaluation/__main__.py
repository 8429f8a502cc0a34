"""`python -m t2mlr.evaluation [lm-eval arguments]`: lm-eval's CLI with the "t2mlr" model (see harness);
`--help` prints the t2mlr section first."""

import sys

from t2mlr.evaluation.harness import main

sys.exit(main())
