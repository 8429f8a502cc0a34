"""The (d_forward, d_backward) grid of the paper's gradient-fidelity figure, as the command line spells it.

Kept apart from `gradient_fidelity` (which needs torch) so `t2mlr analyze --help` can show the defaults
without loading it.
"""

__all__ = ["DEFAULT_ANCHOR", "DEFAULT_DEPTHS"]

DEFAULT_DEPTHS = "2:1,4:1,4:4,8:1,8:4,16:1,16:4,16:16,32:4"
DEFAULT_ANCHOR = "32:32"
