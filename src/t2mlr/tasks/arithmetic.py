"""Generated multi-step arithmetic word problems in GSM-Aug's format, for finetuning a retrofit on CPU.

The paper finetunes on OpenMathReasoning and evaluates on GSM8K; neither can be downloaded here. These
problems have the same shape as GSM-Aug's symbolic variant (a short story, one ``<<a op b=c>>``
equation per reasoning step, an integer answer), small enough that a 135M model can learn the format
in a few thousand CPU steps, but with enough steps and carries that the pretrained model does not
solve them out of the box.

A problem follows one protagonist's stock of one kind of object. The story opens with the stock
(either stated, or as a product ``boxes × per box``, or as a sum ``own + gift``); each later sentence
changes it by one operation (buy/find/receive: +, give/use/lose: −, "has k times as many": ×, "splits
into k equal groups and keeps one": ÷); the question asks for the final stock. Every intermediate
value is a positive integer no larger than ``max_value``; added/subtracted amounts and the opening
numbers are 2..``max_operand`` (so every noun stays plural); factors and divisors are 2..``max_factor``; division is exact.

Record schema (``generate_arithmetic_problems``; all JSON-serialisable)::

    question   str        the story and the question, e.g. "Mia has 12 shells. She finds 7 more shells. ..."
    steps      list[str]  one "<<a op b=c>>" per operation, op in + - * /, in order (GSM-Aug symbolic form)
    answer     str        the final value, an integer in decimal ("25")
    num_steps  int        len(steps)
    ops        list[str]  the operators of the steps, e.g. ["*", "+", "-"]
    split      str        "train" or "eval"

``normalise_cot_record`` (``t2mlr.tasks.loaders``) turns a record into the project's
``{prompt, target, answer}``: prompt = question + "\\n", target = the steps one per line, then
"\\n#### " and the answer. Written with ``write_jsonl``, the records load with
``load_gsm_aug(path=...)``.

Train/eval split: a problem belongs to the evaluation split when the SHA-256 of its equation chain
(the steps joined by ";") falls in bucket 0 of ``SPLIT_BUCKETS``, otherwise to training. Each split
draws from its own seeded stream and keeps only its own problems, so no evaluation problem's
arithmetic ever appears in training (whatever the seeds, counts or stories), and each returned
list holds distinct questions.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from t2mlr.tasks.loaders import normalise_cot_record, retrofit_prompt

__all__ = [
    "OPERATORS",
    "SPLITS",
    "SPLIT_BUCKETS",
    "ArithmeticSettings",
    "apply_operator",
    "arithmetic_cot_records",
    "few_shot_prompt",
    "generate_arithmetic_problems",
    "iter_arithmetic_problems",
    "plain_prompt",
    "split_of_steps",
]

SPLITS = ("train", "eval")
SPLIT_BUCKETS = 10  # one bucket in ten goes to evaluation
OPERATORS = ("+", "-", "*", "/")
MAX_STEPS = 8
_MAX_REJECTIONS = 10_000  # consecutive draws that yield nothing new before the problem space counts as exhausted

NAMES = (
    ("Mia", "she"), ("Liam", "he"), ("Ava", "she"), ("Noah", "he"), ("Zoe", "she"), ("Omar", "he"),
    ("Lena", "she"), ("Ravi", "he"), ("Chloe", "she"), ("Mateo", "he"), ("Nora", "she"), ("Ken", "he"),
    ("Ines", "she"), ("Tom", "he"), ("Sara", "she"), ("Yusuf", "he"), ("Emma", "she"), ("Leo", "he"),
)  # fmt: skip
FRIENDS = ("{pos} brother", "{pos} sister", "a friend", "a neighbour", "a classmate", "{pos} cousin", "{pos} uncle")
OBJECTS = (
    "apples", "marbles", "stickers", "pencils", "cookies", "books", "coins", "shells", "cards", "beads",
    "stamps", "crayons", "buttons", "eggs", "toy cars", "flowers",
)  # fmt: skip
_OBJECT_PRONOUN = {"she": "her", "he": "him"}
_POSSESSIVE = {"she": "her", "he": "his"}

# sentence templates per operation; {b} is the operand, {P} the subject pronoun (capitalised), {p} the
# object pronoun, {obj} the object, {friend} someone else
_ADD = ("{P} buys {b} more {obj}.", "{Friend} gives {p} {b} more {obj}.", "{P} finds {b} more {obj}.")
_SUB = ("{P} gives {b} {obj} to {friend}.", "{P} uses {b} of the {obj}.", "{P} loses {b} {obj}.")
_MUL = (
    "Later {P_lower} has {b} times as many {obj} as before.",
    "{P} collects until {P_lower} has {b} times as many {obj}.",
)
_DIV = (
    "{P} splits the {obj} into {b} equal groups and keeps one group.",
    "{P} shares the {obj} equally among {b} bags and keeps only one bag.",
)
_TEMPLATES = {"+": _ADD, "-": _SUB, "*": _MUL, "/": _DIV}
_QUESTIONS = ("How many {obj} does {name} have now?", "How many {obj} does {name} have at the end?")


@dataclass(frozen=True)
class ArithmeticSettings:
    """Difficulty knobs. The defaults (2-4 steps, amounts up to 50, factors up to 5, values up to 500)
    keep every operand at most two digits and every result at most three, one operation per step."""

    min_steps: int = 2
    max_steps: int = 4
    max_operand: int = 50
    max_factor: int = 5
    max_value: int = 500

    def validate(self) -> None:
        """ValueError naming the bad setting and what is allowed."""
        for name in ("min_steps", "max_steps", "max_operand", "max_factor", "max_value"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= self.min_steps <= self.max_steps <= MAX_STEPS:
            raise ValueError(
                f"need 1 <= min_steps <= max_steps <= {MAX_STEPS}, got min_steps={self.min_steps}, max_steps={self.max_steps}"
            )
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")
        if self.max_factor < 2:
            raise ValueError(f"max_factor must be >= 2, got {self.max_factor}")
        if self.max_value < 2 * self.max_operand:
            raise ValueError(
                f"max_value must be >= 2 * max_operand = {2 * self.max_operand} (room to add), got {self.max_value}"
            )


def apply_operator(a: int, op: str, b: int) -> int:
    """The integer result of ``a op b``; division must be exact."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"{a}/{b} is not an exact integer division")
        return a // b
    raise ValueError(f"operator must be one of {OPERATORS}, got {op!r}")


def _equation(a: int, op: str, b: int) -> tuple[str, int]:
    c = apply_operator(a, op, b)
    return f"<<{a}{op}{b}={c}>>", c


def _operator_of(step: str) -> str:
    """The operator of "<<a op b=c>>" (operands are positive, so the first non-digit after "<<" is it)."""
    return step[2:].lstrip("0123456789")[0]


def split_of_steps(steps: Sequence[str]) -> str:
    """The split ("eval" or "train") fixed by the equation chain alone (see the module docstring)."""
    digest = hashlib.sha256(";".join(steps).encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % SPLIT_BUCKETS == 0 else "train"


# ------------------------------------------------------------------------------------------ one problem
def _feasible_operands(x: int, op: str, s: ArithmeticSettings) -> range:
    """Operands b for which ``x op b`` stays a positive integer within the limits (divisors filtered later)."""
    if op == "+":
        return range(2, min(s.max_operand, s.max_value - x) + 1)
    if op == "-":
        return range(2, min(s.max_operand, x - 1) + 1)
    if op == "*":
        return range(2, min(s.max_factor, s.max_value // x) + 1)
    return range(2, min(s.max_factor, x // 2) + 1)


def _draw_operation(rng: random.Random, x: int, s: ArithmeticSettings) -> tuple[str, int]:
    """A uniformly chosen feasible operator, then a uniformly chosen operand for it."""
    choices: dict[str, list[int]] = {}
    for op in OPERATORS:
        operands = [b for b in _feasible_operands(x, op, s) if op != "/" or x % b == 0]
        if operands:
            choices[op] = operands
    op = rng.choice(sorted(choices))  # "+" is always feasible: max_value >= 2 * max_operand
    return op, rng.choice(choices[op])


def _opening(rng: random.Random, s: ArithmeticSettings, words: dict[str, str]) -> tuple[str, list[str], int]:
    """The first sentence, the equations it implies (zero or one) and the starting stock."""
    kind = rng.choice(("stated", "boxes", "gift"))
    if kind == "stated":
        a = rng.randint(2, s.max_operand)
        return "{name} has {a} {obj}.".format(a=a, **words), [], a
    if kind == "boxes":
        boxes = rng.randint(2, s.max_factor)
        each = rng.randint(2, min(s.max_operand, s.max_value // boxes))
        step, x = _equation(boxes, "*", each)
        text = "{name} buys {boxes} boxes of {obj} with {each} {obj} in each box.".format(
            boxes=boxes, each=each, **words
        )
        return text, [step], x
    own, gift = rng.randint(2, s.max_operand), rng.randint(2, s.max_operand)
    step, x = _equation(own, "+", gift)
    text = "{name} has {own} {obj}, and {friend} gives {p} {gift} more.".format(own=own, gift=gift, **words)
    return text, [step], x


def _story_words(rng: random.Random) -> dict[str, str]:
    name, pronoun = rng.choice(NAMES)
    friend = rng.choice(FRIENDS).format(pos=_POSSESSIVE[pronoun])
    return {
        "name": name,
        "P": pronoun.capitalize(),
        "P_lower": pronoun,
        "p": _OBJECT_PRONOUN[pronoun],
        "obj": rng.choice(OBJECTS),
        "friend": friend,
        "Friend": friend[0].upper() + friend[1:],
    }


def _draw_problem(rng: random.Random, s: ArithmeticSettings) -> dict[str, Any]:
    words = _story_words(rng)
    num_steps = rng.randint(s.min_steps, s.max_steps)  # >= 1, and an opening implies at most one step
    opening, steps, x = _opening(rng, s, words)
    sentences = [opening]
    while len(steps) < num_steps:
        op, b = _draw_operation(rng, x, s)
        step, x = _equation(x, op, b)
        steps.append(step)
        sentences.append(rng.choice(_TEMPLATES[op]).format(b=b, **words))
    sentences.append(rng.choice(_QUESTIONS).format(**words))
    ops = [_operator_of(step) for step in steps]
    return {"question": " ".join(sentences), "steps": steps, "answer": str(x), "num_steps": len(steps), "ops": ops}


# ------------------------------------------------------------------------------------------ streams
def iter_arithmetic_problems(
    split: str = "train", seed: int = 0, settings: ArithmeticSettings | None = None
) -> Iterator[dict[str, Any]]:
    """Endless stream of distinct problems of one split, deterministic in (split, seed, settings).

    Stops with a ValueError when the settings allow no further distinct problem of this split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    settings = settings or ArithmeticSettings()
    settings.validate()
    rng = random.Random(f"t2mlr-arithmetic:{split}:{seed}")
    seen: set[str] = set()
    rejections = 0
    while True:
        problem = _draw_problem(rng, settings)
        if split_of_steps(problem["steps"]) != split or problem["question"] in seen:
            rejections += 1
            if rejections >= _MAX_REJECTIONS:
                raise ValueError(
                    f"settings {settings} allow no more distinct {split} problems after {len(seen)}; widen the ranges"
                )
            continue
        rejections = 0
        seen.add(problem["question"])
        yield {**problem, "split": split}


def generate_arithmetic_problems(
    num: int, split: str = "train", seed: int = 0, settings: ArithmeticSettings | None = None
) -> list[dict[str, Any]]:
    """The first ``num`` problems of ``iter_arithmetic_problems(split, seed, settings)``."""
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ValueError(f"num must be a non-negative int, got {num!r}")
    stream = iter_arithmetic_problems(split, seed, settings)
    return [next(stream) for _ in range(num)]


def arithmetic_cot_records(
    num: int, split: str = "train", seed: int = 0, settings: ArithmeticSettings | None = None
) -> list[dict[str, str]]:
    """The problems normalised to ``{prompt, target, answer}``, exactly as ``load_gsm_aug`` would give them."""
    problems = generate_arithmetic_problems(num, split, seed, settings)
    return [normalise_cot_record(p, f"arithmetic {split} problem {i}") for i, p in enumerate(problems)]


# ------------------------------------------------------------------------------------------ prompts
def plain_prompt(question: str) -> str:
    """Zero-shot prompt for a pretrained model: "Question: …\\nAnswer:"."""
    return f"Question: {question.strip()}\nAnswer:"


def few_shot_prompt(examples: Sequence[dict[str, Any]], question: str) -> str:
    """Solved examples in the GSM-Aug target format, then the question, so the reply shows the format.

    Each example is "Question: …\\nAnswer:\\n<steps, one per line>\\n#### <answer>", separated by a blank
    line; the reply to the final question is meant to stop at the next blank line.
    """
    shots = [plain_prompt(e["question"]) + "\n" + "\n".join(e["steps"]) + f"\n#### {e['answer']}" for e in examples]
    return "\n\n".join([*shots, plain_prompt(question)]) + "\n"


def arithmetic_retrofit_records(num: int, split: str, seed: int, settings: ArithmeticSettings) -> list[dict[str, str]]:
    """Generated problems as records whose prompt is the retrofit's "Question: …\nAnswer:\n"."""
    records = arithmetic_cot_records(num, split, seed, settings)
    return [{**r, "prompt": retrofit_prompt(r["prompt"])} for r in records]
