"""Task data for T²MLR: generators, tokenizers, loaders and metrics (docs/semantics.md §7).

Synthetic tasks: ``s5_retrieval`` (over the group in ``s5``), ``variable_assignment`` and
``prosqa``; chain-of-thought sets through ``loaders``; word-level tokenizers in ``tokenizers``;
metrics in ``scoring``; the ``t2mlr data …`` command in ``commands``.

The tokenizer helpers load on first use (PEP 562, as in ``t2mlr``): they import ``transformers``, which
the generators, scorers and ``t2mlr data --help`` do not need.
"""

from t2mlr.tasks.jsonl import read_jsonl, write_jsonl
from t2mlr.tasks.loaders import DataUnavailableError, load_gsm_aug, load_hotpotqa_cot
from t2mlr.tasks.prosqa import check_answer, check_path, generate_prosqa_hard
from t2mlr.tasks.s5 import (
    ELEMENTS,
    IDENTITY,
    compose,
    inverse,
    perm_to_token,
    running_products,
    token_to_perm,
)
from t2mlr.tasks.s5_retrieval import (
    generate_s5_eval,
    generate_s5_retrieval,
    iter_s5_retrieval,
    s5_targets_from_input,
)
from t2mlr.tasks.scoring import (
    aggregate_s5_by_n,
    extract_gsm_answer,
    gsm_exact_match,
    score_s5_prediction,
    score_s5_predictions,
    variable_assignment_exact_match,
)
from t2mlr.tasks.variable_assignment import (
    generate_variable_assignment,
    solve_variable_assignment,
)
from t2mlr.utils import lazy_names

__all__ = [
    "DataUnavailableError",
    "ELEMENTS",
    "IDENTITY",
    "aggregate_s5_by_n",
    "build_s5_tokenizer",
    "build_word_tokenizer",
    "check_answer",
    "check_path",
    "compose",
    "encode_s5_sample",
    "extract_gsm_answer",
    "generate_prosqa_hard",
    "generate_s5_eval",
    "generate_s5_retrieval",
    "generate_variable_assignment",
    "gsm_exact_match",
    "inverse",
    "iter_s5_retrieval",
    "load_gsm_aug",
    "load_hotpotqa_cot",
    "perm_to_token",
    "read_jsonl",
    "running_products",
    "s5_targets_from_input",
    "score_s5_prediction",
    "score_s5_predictions",
    "solve_variable_assignment",
    "token_to_perm",
    "variable_assignment_exact_match",
    "write_jsonl",
]

_TOKENIZER_NAMES = ("build_s5_tokenizer", "build_word_tokenizer", "encode_s5_sample")

# The tokenizer helpers (and transformers) load on first access.
__getattr__ = lazy_names(__name__, dict.fromkeys(_TOKENIZER_NAMES, "tokenizers"))
