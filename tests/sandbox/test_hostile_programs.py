"""Programs and responses written against the code reward itself: forged numbers, forged
verdicts, state carried between test cases, responses built to stall the parser.

Graded programs go through `code.score` (what a run's verifier calls), tool calls through
`run_python`, in the real bubblewrap sandbox; the limits and fixtures are
`test_sandbox`'s.
"""

from __future__ import annotations

import dataclasses
import random
import re
import signal
import unicodedata

import pytest
from test_sandbox import CFG, LIMITS, real_sandbox  # noqa: F401 - a fixture

from rlvr.rewards import code
from rlvr.sandbox import python as tool_lib

TOL = dataclasses.replace(CFG, float_tol=1e-6, workers=4)


def _reasons(programs, tests, cfg=CFG) -> list[str]:
  result = code.score(programs, [tests] * len(programs), cfg)
  return [v.reason for v in result.verdicts]


# ---------------------------------------------------------------------------
# Numbers compare as numbers.


def test_a_float_tolerance_never_matches_what_is_not_that_number():
  big = "9" * 401  # a float of it overflows
  forged = ["inf", "Infinity", "1e400", "-inf", "nan", big[:-1] + "8"]
  programs = [f"print('{x}')" for x in forged] + [f"print('00{big}')"]
  reasons = _reasons(programs, {"inputs": [""], "outputs": [big]}, TOL)
  shown = [x if len(x) < 10 else f"{x[:3]}...{x[-3:]}" for x in forged] + ["00999...999"]
  print("against a 401-digit integer:", dict(zip(shown, reasons)))
  assert reasons == ["wrong_answer"] * len(forged) + ["ok"]
  # integers compare exactly, beyond a float's 53 bits too
  exact = {"inputs": [""], "outputs": ["9007199254740993"]}
  assert _reasons(["print(9007199254740992)"], exact, TOL) == ["wrong_answer"]
  inf = {"inputs": [""], "outputs": ["inf"]}
  assert _reasons(["print('inf')", "print('-inf')", "print(1e308)"], inf, TOL) == [
    "ok",
    "wrong_answer",
    "wrong_answer",
  ]
  assert code.lines_match("1e400 0.5000001", "1" + "0" * 400 + " 0.5", 1e-6)


def test_returned_integers_compare_exactly_under_a_float_tolerance():
  tests = {"fn_name": "f", "inputs": [[0]], "outputs": [2**53 + 1]}
  assert _reasons(["def f(x):\n  return 2 ** 53\n"], tests, TOL) == ["wrong_answer"]
  assert not code.values_match(float("nan"), float("nan"), 1e-6)
  assert not code.values_match(float("inf"), 10**400, 1e-6)
  assert code.values_match(float("inf"), float("inf"), 1e-6)
  assert not code.values_match(float("-inf"), float("inf"), 1e-6)
  assert code.values_match(0.5000001, 0.5, 1e-6) and code.values_match(3, 3.0000001, 1e-6)


# ---------------------------------------------------------------------------
# The judge decides the verdict.

# A result line of the program's own on the judge's result channel (fd 3), or a signal that
# names a limit the program never reached.
FORGED = {
  "judge_error": 'import os\nos.write(3, b\'\\n{"status": "judge_error"}\\n\')\nos._exit(0)\n',
  "timeout": 'import os\nos.write(3, b\'\\n{"status": "timeout"}\\n\')\nos._exit(0)\n',
  "output_limit": 'import os\nos.write(3, b\'\\n{"status": "output_limit"}\\n\')\nos._exit(0)\n',
  "long": "import os\nos.write(3, b'\\n{\"status\": \"' + b'x' * 2025 + b'\"}\\n')\nos._exit(0)\n",
  "sigxcpu": "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\n",
  "sigxfsz": (
    "import os, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.SIGXFSZ)\n"
  ),
}
DOUBLE_OR_FORGE = (  # case 0 forges; case 1 answers
  "import os\nn = int(input())\nif n == 2:\n"
  '  os.write(3, b\'\\n{"status": "runtime_error", "detail": %s}\\n\')\n  os._exit(0)\n'
  "print(n * 2)\n"
)


def test_a_program_cannot_name_its_own_verdict():
  names = list(FORGED)
  reasons = _reasons([FORGED[n] for n in names], {"inputs": [""], "outputs": ["4"]}, TOL)
  print("forged verdicts:", dict(zip(names, reasons)))
  assert reasons == ["runtime_error"] * len(names)


def _clean(detail: str) -> bool:
  return len(detail) <= 500 and not any(unicodedata.category(c) in ("Cc", "Cs") for c in detail)


@pytest.mark.parametrize(
  "detail",
  ["5", '{"a": [1]}', '"\\ud800\\u0007\\u001b[2J' + "A" * 5000 + '"'],
  ids=["int", "object", "control_surrogate_long"],
)
def test_a_forged_detail_is_text_of_bounded_length(detail):
  program = DOUBLE_OR_FORGE % detail
  cfg = dataclasses.replace(CFG, pass_fraction=True)
  verdict = code.score([program], [{"inputs": ["2\n", "21\n"], "outputs": ["4", "42"]}], cfg)
  verdict = verdict.verdicts[0]
  print(f"detail {detail[:20]!r}...:", verdict)
  assert (verdict.passed, verdict.reason) == (1, "runtime_error"), verdict
  assert isinstance(verdict.detail, str) and _clean(verdict.detail), verdict


def test_a_tool_calls_status_is_one_of_a_fixed_set():
  statuses = {}
  for name in ("judge_error", "long", "sigxcpu"):
    result = tool_lib.run_python(FORGED[name], LIMITS)
    statuses[name] = result.status
  print("tool statuses:", {k: v[:40] for k, v in statuses.items()})
  assert set(statuses.values()) <= set(tool_lib.TOOL_STATUSES), statuses
  assert statuses == dict.fromkeys(statuses, "runtime_error")


# ---------------------------------------------------------------------------
# Test cases are isolated.

LEFT_OVER = r"""import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
CREATE = 0o3600  # IPC_CREAT | IPC_EXCL: EEXIST where an earlier case's object is left

def left(ret):
  return ret < 0 and ctypes.get_errno() == errno.EEXIST  # (the filter may refuse mq_open)

found = [name for name, gone in (
  ("file", os.path.exists("/tmp/mark")),
  ("msg", left(libc.msgget(0x5EED, CREATE))),
  ("sem", left(libc.semget(0x5EED, 1, CREATE))),
  ("shm", left(libc.shmget(0x5EED, 4096, CREATE))),
  ("mq", left(libc.mq_open(b"/rlvr", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None))),
) if gone]
os.makedirs("/tmp/deep/" + "/".join(["d"] * 50))
os.chmod("/tmp/deep/d", 0)
open("/tmp/mark", "w").write("x")
print(" ".join(found) or "fresh")
"""


def test_each_test_case_starts_from_an_empty_tmp_and_no_ipc_objects():
  tests = {"inputs": ["", "", ""], "outputs": ["fresh"] * 3}
  verdict = code.score([LEFT_OVER], [tests], CFG).verdicts[0]
  print("three cases:", verdict)
  assert verdict == code.Verdict(3, 3, "ok"), verdict


# ---------------------------------------------------------------------------
# Bounded parsing.

# The fence regex the linear scan replaces: the reference on every input.
_FENCE_RE = re.compile(
  r"^[ \t]*```[ \t]*(\S*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL
)


def _reference_block(text: str) -> str | None:
  found = None
  for m in _FENCE_RE.finditer(text):
    if m.group(1).lower() in ("", "python", "python3", "py"):
      found = m.group(2)
  return found


def _alarm(*_):
  raise TimeoutError("parsing took more than 10 s")


def test_unclosed_fences_parse_in_linear_time():
  text = "```python\n" * 50_000
  old = signal.signal(signal.SIGALRM, _alarm)
  signal.alarm(10)  # quadratic parsing of this text takes minutes
  try:
    program = code.extract_program(text)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
  assert program is None


def test_the_block_found_is_the_fence_regexs_on_any_text():
  rng = random.Random(0)
  parts = ["```", "```python", "```py", "```text", "```Python3", " ", "\t", "\n", "\n", "x", "\r"]
  parts += ["``` py x", "````", "`", "print(1)", "```  ", "\x85", "\u2028", "\xa0"]
  for _ in range(3000):
    text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 30)))
    assert code.last_python_block(text) == _reference_block(text), repr(text)


def test_a_response_over_the_bound_is_not_parsed():
  cfg = code.CodeRewardConfig(limits=LIMITS, max_response_chars=1000)
  response = "```python\nprint(int(input()) * 2)\n```\n" + "#" * 1000
  result = code.score([response], [{"inputs": ["2\n"], "outputs": ["4"]}], cfg)
  print("a response over the bound:", result.verdicts)
  assert result.verdicts[0].reason == "too_long" and "1000" in result.verdicts[0].detail
  assert "too_long" in code.REASONS
