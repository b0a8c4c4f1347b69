"""Test formats as datasets ship them, and how outputs are compared: `parse_tests`, `TestSpec`.

- stdin/stdout (Apps, CodeContests, TACO, PRIME-RL): `{"inputs": [...], "outputs": [...]}`
  (also `input` / `output`); an input or output may be a list of lines. Outputs match line by
  line, each line as its whitespace-separated tokens (so spacing, `\\r\\n` and blank lines at
  either end do not matter); with a float tolerance, numeric tokens also match as numbers
  (`numbers_close`).
- call-based (Apps, TACO): `{"fn_name": ..., "inputs": [[args], ...], "outputs": [...]}`;
  the function is top-level or a method of `class Solution`. Returned values travel as JSON
  (tuples become lists, sets sorted lists); an expected value wrapped in a one-element list
  also matches its element (Apps' convention).
- assert-based (HumanEval, MBPP): `{"test": "<code defining check(candidate)>",
  "entry_point": ...}`, or `{"test_list": ["assert ...", ...]}`; one test, passed when the
  checks raise nothing.

A JSON string of any of these (how Apps stores `input_output`) is parsed first.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import math
import re

from rlvr.sandbox import jobs
from rlvr.sandbox.limits import clean_text

KINDS = ("stdio", "call", "assert")


def _text(value, what: str) -> str:
  """A str, or a list of lines joined by newlines."""
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(v, str) for v in value):
    return "\n".join(value)
  raise TypeError(f"{what}: expected a str or a list of str, got {type(value).__name__}")


def _json_value(value, what: str):
  """`value` as it reads back from JSON (the form the judge's results take)."""
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise TypeError(f"{what}: not JSON-serializable ({e})") from None


@dataclasses.dataclass(frozen=True)
class TestSpec:
  """One problem's tests in one of `KINDS`: inputs, expected outputs, and how to call."""

  kind: str
  inputs: tuple
  outputs: tuple
  fn_name: str | None = None
  test: str | None = None
  entry_point: str | None = None

  @property
  def total(self) -> int:
    return len(self.inputs)

  def job(self, program: str, limits) -> dict:
    """The judge's job: the program, the inputs (never the expected outputs), the limits."""
    return jobs.job(
      self.kind,
      program,
      self.inputs,
      limits,
      fn_name=self.fn_name,
      test=self.test,
      entry_point=self.entry_point,
    )

  def judge(self, index: int, msg: dict, float_tol: float) -> tuple[bool, str, str]:
    """(passed, reason, detail) of the judge's message on case `index`."""
    status = msg.get("status")
    if status != "ok":
      known = ("wrong_answer", "timeout", "memory", "runtime_error", "output_limit", "judge_error")
      reason = status if status in known else "runtime_error"
      return False, reason, clean_text(msg.get("detail", ""), 300)
    if self.kind == "assert":
      return True, "ok", ""
    want = self.outputs[index]
    if self.kind == "stdio":
      got = msg.get("stdout", "")
      ok = lines_match(got if isinstance(got, str) else "", want, float_tol)
    else:
      got = msg.get("value")
      ok = values_match(got, want, float_tol)
    return ok, "ok" if ok else "wrong_answer", f"expected {_short(want)}, got {_short(got)}"


def _short(value, n: int = 80) -> str:
  try:
    text = repr(value)
  except (RecursionError, ValueError):  # nested too deep; an int with too many digits
    return f"<a {type(value).__name__} too large to show>"
  return text if len(text) <= n else text[:n] + "..."


def parse_tests(tests) -> TestSpec:
  """A `TestSpec` from a dict (or its JSON string) in any of the formats above."""
  if isinstance(tests, TestSpec):
    return tests
  if isinstance(tests, (str, bytes)):
    try:
      tests = json.loads(tests)
    except json.JSONDecodeError as e:  # its "line 1 column 1" would read as the file's line
      raise ValueError(f"tests: not valid JSON ({e.msg} at character {e.pos + 1})") from None
  if not isinstance(tests, dict):
    raise TypeError(f"tests: expected a dict or its JSON string, got {type(tests).__name__}")
  if "test" in tests or "test_list" in tests:
    test = tests.get("test")
    if test is None:
      test = "\n".join(_text(t, "tests.test_list[]") for t in tests["test_list"])
    entry = tests.get("entry_point") or None
    return TestSpec("assert", (None,), (None,), test=_text(test, "tests.test"), entry_point=entry)
  inputs = tests.get("inputs", tests.get("input"))
  outputs = tests.get("outputs", tests.get("output"))
  if not isinstance(inputs, list) or not isinstance(outputs, list):
    raise ValueError(
      f"tests: expected lists under inputs/outputs (or test / test_list), got keys {sorted(tests)}"
    )
  if not inputs or len(inputs) != len(outputs):
    raise ValueError(
      f"tests: need as many outputs as inputs, at least one ({len(inputs)} vs {len(outputs)})"
    )
  fn_name = tests.get("fn_name") or None
  if fn_name is None:
    return TestSpec(
      "stdio",
      tuple(_text(x, "tests.inputs[]") for x in inputs),
      tuple(_text(y, "tests.outputs[]") for y in outputs),
    )
  args = tuple(_json_value(x if isinstance(x, list) else [x], "tests.inputs[]") for x in inputs)
  return TestSpec(
    "call", args, tuple(_json_value(y, "tests.outputs[]") for y in outputs), fn_name=str(fn_name)
  )


# ---------------------------------------------------------------------------
# Comparisons.


def _lines(text: str) -> list[list[str]]:
  """Whitespace-separated tokens per line, blank lines at either end dropped."""
  lines = [line.split() for line in text.splitlines()]
  while lines and not lines[-1]:
    lines.pop()
  start = 0
  while start < len(lines) and not lines[start]:
    start += 1
  return lines[start:]


_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(
  r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE
)
# Where a float overflows: decimal arithmetic with room for any exponent a token can carry.
_WIDE = decimal.Context(
  prec=40, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.InvalidOperation]
)


def _finite(x: int | float | decimal.Decimal) -> bool:
  if isinstance(x, decimal.Decimal):
    return x.is_finite()
  return isinstance(x, int) or math.isfinite(x)


def numbers_close(a, b, tol: float) -> bool:
  """Whether two numbers (int, float or Decimal; no bools) match: equal, or within `tol`
  (absolute or relative) when it is > 0.

  Two ints compare exactly. nan matches nothing; an infinity only the same infinity. Where a
  float would overflow (a 401-digit integer, 1e400) the numbers compare in decimal
  arithmetic, never as two infinities.
  """
  if not (_finite(a) and _finite(b)):
    return a == b  # nan == nan is False
  if a == b:
    return True  # exact, across int, float and Decimal
  if tol <= 0 or (isinstance(a, int) and isinstance(b, int)):
    return False
  try:
    fa, fb = float(a), float(b)
  except OverflowError:  # an int past the float range
    fa = fb = math.inf
  if math.isfinite(fa) and math.isfinite(fb):
    return math.isclose(fa, fb, rel_tol=tol, abs_tol=tol)
  with decimal.localcontext(_WIDE):
    da, db = decimal.Decimal(a), decimal.Decimal(b)
    bound = max(abs(da), abs(db)) * decimal.Decimal(tol)
    return abs(da - db) <= max(bound, decimal.Decimal(tol))


def _token_number(token: str) -> decimal.Decimal | None:
  """The number a token writes (decimal digits, an exponent, inf, nan), exactly; else None."""
  if _NUMBER.fullmatch(token) is None:
    return None
  try:
    return decimal.Decimal(token)
  except decimal.InvalidOperation:  # an exponent beyond any Decimal
    return None


def _token_match(a: str, b: str, tol: float) -> bool:
  """Equal tokens; with a tolerance, tokens writing matching numbers (two integers: equal)."""
  if a == b:
    return True
  if tol <= 0:
    return False
  x, y = _token_number(a), _token_number(b)
  if x is None or y is None:
    return False
  if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
    return x == y
  return numbers_close(x, y, tol)


def lines_match(got: str, want: str, float_tol: float = 0.0) -> bool:
  """Whether stdout `got` matches `want` line by line, token by token."""
  g, w = _lines(got), _lines(want)
  return len(g) == len(w) and all(
    len(a) == len(b) and all(_token_match(x, y, float_tol) for x, y in zip(a, b))
    for a, b in zip(g, w)
  )


def _value_eq(a, b, tol: float) -> bool:
  """JSON values equal; numbers within tolerance; a bool matches only a bool."""
  if isinstance(a, bool) or isinstance(b, bool):
    return type(a) is type(b) and a == b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return numbers_close(a, b, tol)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_value_eq(x, y, tol) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_value_eq(a[k], b[k], tol) for k in a)
  return type(a) is type(b) and a == b


def values_match(got, want, float_tol: float = 0.0) -> bool:
  """Whether a returned value matches the expected one (or the sole element wrapping it)."""
  if _value_eq(got, want, float_tol):
    return True
  return isinstance(want, list) and len(want) == 1 and _value_eq(got, want[0], float_tol)
