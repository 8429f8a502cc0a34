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

lm-evaluation-harness's two GSM8K metrics (``gsm8k_strict_match``, ``gsm8k_flexible_extract``) are the ones
to report beside it, since the rule above credits a reply cut off before its answer whenever its last
number (often one copied from the question) happens to be the answer:

- strict-match: the first ``#### <number>`` (lm-eval's ``gsm8k`` task), else the first ``The answer is
  <number>`` followed by one more character (its ``gsm8k-cot`` task); nothing else counts;
- flexible-extract: the last number-like run in the reply (``-?[$0-9.,]{2,}`` or ``-?[0-9]+``).

Both then compare as lm-eval's ``exact_match`` does with the task's settings: ``,``, ``$``, everything up
to a ``#### `` and a trailing ``.`` removed from prediction and reference, case ignored, strings equal
(so ``"360.0"`` does not equal ``"360"`` there).

MATH (``math_equiv``): the answer inside the reply's last ``\\boxed{...}`` (or ``\\boxed x``,
``\\fbox{...}``), compared with the reference after the normalisation of Hendrycks et al.'s MATH
evaluation (their ``is_equiv``/``strip_string``, also lm-eval's ``hendrycks_math``): line breaks,
``\\!``, ``\\left``/``\\right``, degree marks, ``\\$``, a ``\\text{ unit}`` tail, ``\\%`` and
spaces removed; ``tfrac``/``dfrac`` read as ``frac``; ``.5`` as ``0.5``; a short ``k = `` prefix dropped;
``\\sqrt3`` as ``\\sqrt{3}``, ``\\frac12`` as ``\\frac{1}{2}``, ``0.5`` and ``1/2`` as
``\\frac{1}{2}``; then the strings must be equal.

MATH with a maintained equivalence checker (``math_verify_equiv``): the same boxed answer, compared with the
reference by Hugging Face's ``math-verify`` (``pip install math-verify``): both are read as LaTeX into sympy and
compared as mathematical objects (numbers, fractions, radicals, intervals, sets, matrices, equations), so
``\\frac{2}{4}``, ``0.5`` and ``x(x+2)`` equal ``\\frac{1}{2}``, ``\\frac12`` and ``x^2+2x``, which the string
rule above does not see.

pass@k (``pass_at_k``): the unbiased estimator of the chance that at least one of k samples is right, from n
samples of a problem of which c are right (Chen et al. 2021): 1 − C(n − c, k) / C(n, k), averaged over problems.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

__all__ = [
    "S5Score",
    "aggregate_s5_by_n",
    "extract_boxed_answer",
    "extract_gsm_answer",
    "extract_math_answer",
    "gsm8k_flexible_extract",
    "gsm8k_flexible_match",
    "gsm8k_match",
    "gsm8k_strict_extract",
    "gsm8k_strict_match",
    "gsm_exact_match",
    "math_equiv",
    "math_match",
    "math_verify_equiv",
    "math_verify_match",
    "mean_pass_at_k",
    "normalize_answer",
    "normalize_math_answer",
    "pass_at_k",
    "qa_exact_match",
    "qa_token_f1",
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


# ---------------------------------------------------------------------------------------------- lm-eval's GSM8K

# The patterns and comparison settings of lm-eval's gsm8k.yaml / gsm8k-cot.yaml (task version 3.0).
_GSM8K_STRICT = (re.compile(r"#### (\-?[0-9\.\,]+)"), re.compile(r"The answer is (\-?[0-9\.\,]+)."))
_GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_GSM8K_IGNORED = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def _first_group(match: str | tuple[str, ...]) -> str:
    """A `findall` item as lm-eval's regex filter reads it: the first non-empty group of a tuple."""
    if isinstance(match, tuple):
        match = next((group for group in match if group), "")
    return match.strip()


def gsm8k_strict_extract(text: str) -> str | None:
    """The answer strict-match reads: the first ``#### <number>``, else the first ``The answer is <number>.``;
    None when the reply has neither (lm-eval scores that as "[invalid]", never right)."""
    for pattern in _GSM8K_STRICT:
        found = pattern.findall(text)
        if found:
            return _first_group(found[0])
    return None


def gsm8k_flexible_extract(text: str) -> str | None:
    """The answer flexible-extract reads: the last number-like run of the reply; None when there is none."""
    found = _GSM8K_FLEXIBLE.findall(text)
    return _first_group(found[-1]) if found else None


def _gsm8k_canonical(text: str) -> str:
    for pattern in _GSM8K_IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def gsm8k_match(extracted: str | None, answer: str) -> bool:
    """lm-eval's exact_match with the GSM8K task's settings (see the module docstring); None is wrong."""
    return extracted is not None and _gsm8k_canonical(extracted) == _gsm8k_canonical(answer)


def gsm8k_strict_match(reply: str, answer: str) -> bool:
    return gsm8k_match(gsm8k_strict_extract(reply), answer)


def gsm8k_flexible_match(reply: str, answer: str) -> bool:
    return gsm8k_match(gsm8k_flexible_extract(reply), answer)


# ---------------------------------------------------------------------------------------------- MATH


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces kept) or of a ``\\boxed x``
    (up to the next ``$``); None when there is none or its braces never close."""
    if "\\boxed " in text:
        return text.rsplit("\\boxed ", 1)[1].split("$")[0].strip()
    for command in ("\\boxed", "\\fbox"):
        position = text.rfind(command)
        if position >= 0:
            brace = text.find("{", position)
            if brace < 0 or text[position + len(command) : brace].strip():
                return None
            return _balanced_braces(text, brace)
    return None


def extract_math_answer(text: str) -> str | None:
    """A MATH solution's final answer: its last boxed expression (see the module docstring)."""
    inside = _last_boxed(text)
    return inside if inside is not None and inside.strip() else None


def _fix_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; unchanged when a frac has fewer
    than two characters after it."""
    head, *rest = text.split("\\frac")
    out = [head]
    for part in rest:
        out.append("\\frac")
        if part.startswith("{"):
            out.append(part)
            continue
        if len(part) < 2:
            return text
        numerator, second, tail = part[0], part[1], part[2:]
        out.append("{" + numerator + "}" + (second + tail if second == "{" else "{" + second + "}" + tail))
    return "".join(out)


def _fix_slash(text: str) -> str:
    """``3/4`` (two integers written plainly) -> ``\\frac{3}{4}``."""
    match = re.fullmatch(r"(-?\d+)/(-?\d+)", text)
    if match is None or text != f"{int(match.group(1))}/{int(match.group(2))}":
        return text
    return "\\frac{" + match.group(1) + "}{" + match.group(2) + "}"


def _fix_sqrt(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character after the command)."""
    return re.sub(r"\\sqrt([^{])", r"\\sqrt{\1}", text)


def normalize_math_answer(answer: str) -> str:
    """A MATH answer in the canonical form of Hendrycks et al.'s ``strip_string`` (module docstring)."""
    text = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if text.count("\\text{ ") == 1:  # a single unit on the right
        text = text.split("\\text{ ")[0]
    text = text.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        text = sides[1]
    text = _fix_fracs(_fix_sqrt(text).replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_slash(text)


def math_match(extracted: str | None, answer: str) -> bool:
    """An extracted MATH answer equals the reference after MATH's normalisation; None is wrong."""
    return extracted is not None and normalize_math_answer(extracted) == normalize_math_answer(answer)


def math_equiv(reply: str, answer: str) -> bool:
    """The reply's boxed answer equals the reference answer after MATH's normalisation."""
    return math_match(extract_math_answer(reply), answer)


MATH_VERIFY_TIMEOUT = 5  # seconds for parsing and for comparing one answer (math-verify's own default)


def math_verify_match(extracted: str | None, answer: str) -> bool:
    """An extracted answer equals the reference as math-verify compares them (both read as LaTeX, as if boxed);
    None is wrong."""
    if extracted is None:
        return False
    try:
        from math_verify import parse, verify
    except ImportError as err:
        raise ImportError("math_verify_equiv needs the math-verify package: pip install math-verify (or the "
                          "t2mlr[eval] extra)") from err
    # math-verify's time limits use SIGALRM, which only the main thread may set
    timeout = MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    predicted = parse(f"\\boxed{{{extracted}}}", parsing_timeout=timeout)
    return bool(gold) and bool(predicted) and verify(gold, predicted, timeout_seconds=timeout)


def math_verify_equiv(reply: str, answer: str) -> bool:
    """The reply's last boxed answer (as `math_equiv` extracts it) equals the reference by math-verify."""
    return math_verify_match(extract_math_answer(reply), answer)


# ---------------------------------------------------------------------------------------------- pass@k


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """Unbiased pass@k of one problem with `correct` of `samples` samples right: 1 − C(n − c, k) / C(n, k)."""
    if not 0 <= correct <= samples:
        raise ValueError(f"correct must be in 0..samples ({samples}), got {correct}")
    if not 1 <= k <= samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= samples per problem ({samples})")
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def mean_pass_at_k(correct_counts: Sequence[int], samples: int, k: int) -> float:
    """pass@k over problems, each with `samples` samples of which `correct_counts[i]` are right."""
    if not correct_counts:
        raise ValueError("pass@k needs at least one problem")
    return sum(pass_at_k(samples, correct, k) for correct in correct_counts) / len(correct_counts)


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
