"""Task metrics: S5-Retrieval per-N accuracy, variable-assignment and GSM exact match.

S5-Retrieval is scored only after the delimiter (positions ``t >= score_start``): the target
over the dictionary is a copy of the input, and scoring it would inflate accuracy (docs/semantics.md §7).
Predictions are aligned with targets position for position (the transduction convention of
``t2mlr.tasks.tokenizers``): ``predicted[t]`` is the model's output at position t. Tokens may be
ids or strings, as long as predictions and targets use the same kind.

GSM answer extraction rule (``extract_gsm_answer``):

1. If the text contains ``####``, look at the text after the last ``####``; otherwise, if it
   contains ``The answer is`` (case-insensitive), at the text after its last occurrence.
   In that segment take the first number; if there is none, the stripped segment itself
   (trailing ``.`` removed).
2. Otherwise take the last number in the whole text; with no number at all, return None.

Numbers are matched as ``-?digits[,digits]*[.digits]`` and commas are removed. Two answers
match when their normalised strings are equal, or both are numbers of equal value
(``"360"`` equals ``"360.0"``).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

__all__ = [
    "S5Score",
    "aggregate_s5_by_n",
    "extract_boxed_answer",
    "extract_gsm_answer",
    "gsm_exact_match",
    "qa_exact_match",
    "qa_token_f1",
    "normalize_answer",
    "score_s5_prediction",
    "score_s5_predictions",
    "variable_assignment_exact_match",
]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE)


class S5Score(NamedTuple):
    """Result for one sequence: fully correct?, correct scored tokens, scored tokens."""

    exact: bool
    correct: int
    total: int


def score_s5_prediction(
    predicted: Sequence[Hashable], target: Sequence[Hashable], score_start: int
) -> S5Score:
    """Exact match and correct-token count over ``target[score_start:]``.

    ``predicted`` must cover the whole sequence (same length as ``target``).
    """
    if len(predicted) != len(target):
        raise ValueError(f"prediction length {len(predicted)} != target length {len(target)}")
    if not (0 <= score_start < len(target)):
        raise ValueError(f"score_start={score_start} leaves nothing to score in length {len(target)}")
    pairs = list(zip(predicted[score_start:], target[score_start:]))
    correct = sum(p == t for p, t in pairs)
    return S5Score(correct == len(pairs), correct, len(pairs))


def aggregate_s5_by_n(records: Iterable[tuple[int, S5Score]]) -> dict[int, tuple[float, float, int]]:
    """``{n: (exact_match, token_acc, count)}`` from ``(n, score)`` pairs, sorted by n.

    exact_match is the fraction of sequences fully correct; token_acc is pooled over all scored
    tokens of that N (every sequence of one N has the same number of scored tokens, so this
    equals the mean per-sequence accuracy).
    """
    sums: dict[int, list[int]] = {}
    for n, score in records:
        exact, correct, total = score
        acc = sums.setdefault(int(n), [0, 0, 0, 0])
        acc[0] += int(bool(exact))
        acc[1] += int(correct)
        acc[2] += int(total)
        acc[3] += 1
    return {n: (e / c, (k / t if t else 0.0), c) for n, (e, k, t, c) in sorted(sums.items())}


def score_s5_predictions(
    samples: Sequence[Mapping[str, Any]], predictions: Sequence[Sequence[Hashable]]
) -> dict[int, tuple[float, float, int]]:
    """Per-N metrics for samples (with ``target_tokens``, ``score_start``, ``n``) and predictions."""
    if len(samples) != len(predictions):
        raise ValueError(f"{len(samples)} samples but {len(predictions)} predictions")
    records = (
        (s["n"], score_s5_prediction(p, s["target_tokens"], int(s["score_start"])))
        for s, p in zip(samples, predictions)
    )
    return aggregate_s5_by_n(records)


def variable_assignment_exact_match(prediction: str, answer: str) -> bool:
    """True iff the first whitespace-separated token of the prediction equals the answer.

    A leading ``|`` (the prompt's answer delimiter, if echoed) is ignored.
    """
    text = prediction.strip().lstrip("|").strip()
    first = text.split()[0] if text else ""
    return first == answer.strip()


def _clean_number(text: str) -> str:
    return text.replace(",", "")


def extract_gsm_answer(text: str) -> str | None:
    """The final answer of a GSM-style solution, by the rule in the module docstring."""
    segment: str | None = None
    if "####" in text:
        segment = text.rsplit("####", 1)[1]
    else:
        matches = list(_ANSWER_IS.finditer(text))
        if matches:
            segment = text[matches[-1].end() :]
    if segment is not None:
        number = _NUMBER.search(segment)
        if number:
            return _clean_number(number.group(0))
        stripped = segment.strip().rstrip(".").strip()
        return stripped or None
    numbers = _NUMBER.findall(text)
    return _clean_number(numbers[-1]) if numbers else None


def normalize_answer(answer: str) -> str:
    """Strip whitespace, a trailing period and thousands separators."""
    return _clean_number(answer.strip().rstrip(".").strip())


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def gsm_exact_match(prediction: str, answer: str) -> bool:
    """Extract the predicted answer and compare it with the reference answer."""
    predicted = extract_gsm_answer(prediction)
    if predicted is None:
        return False
    a, b = normalize_answer(predicted), normalize_answer(answer)
    if a == b:
        return True
    da, db = _as_decimal(a), _as_decimal(b)
    return da is not None and db is not None and da == db


# ---------------------------------------------------------------------------------------------- HotpotQA

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = re.compile(r"[^\w\s]")


def _balanced_braces(text: str, start: int) -> str | None:
    """The text inside the brace group opening at ``text[start] == "{"``; None when it never closes."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def extract_boxed_answer(text: str) -> str | None:
    """The answer of a chain-of-thought QA output: the last ``\\boxed{...}`` (nested braces kept), else the
    text after the last ``####`` (the project's CoT target format), else None. Stripped; empty is None."""
    position = text.rfind("\\boxed{")
    if position >= 0:
        inside = _balanced_braces(text, position + len("\\boxed"))
        if inside is not None and inside.strip():
            return inside.strip()
        return None
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


def normalize_qa_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, whitespace collapsed (HotpotQA's rule)."""
    text = _PUNCTUATION.sub(" ", text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def qa_exact_match(predicted: str | None, gold: str) -> bool:
    """Normalised answers equal (a missing prediction is wrong)."""
    return predicted is not None and normalize_qa_answer(predicted) == normalize_qa_answer(gold)


def qa_token_f1(predicted: str | None, gold: str) -> float:
    """F1 of the normalised answers' word multisets (0 for a missing or empty prediction)."""
    if predicted is None:
        return 0.0
    pred, ref = normalize_qa_answer(predicted).split(), normalize_qa_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum(min(pred.count(w), ref.count(w)) for w in set(pred))
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)
