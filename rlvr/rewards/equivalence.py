"""Answer equivalence: LaTeX normalisation, then math-verify.

Strings settle most pairs (identical, integer-normalised, cleaned, the same
words); the rest go to math-verify (sympy), whose own `signal.alarm` timeouts
work only in a process's main thread, so `is_equivalent` is meant to run in a
`RewardPool` worker (rlvr/rewards/pool.py).
"""

from __future__ import annotations

import collections
import math
import re
import time

from rlvr.rewards.extraction import _braced_group

# ----------------------------------------------------------------------------
# Normalisation
# ----------------------------------------------------------------------------

_TEXT_CMD = r"\\(?:text|textbf|textit|textrm|mathrm|mbox|mathbf|operatorname)"
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_INTEGER_RE = re.compile(r"^[+-]?\d+$")


def _unwrap_text(s: str) -> str:
  r"""`\text{abc}` -> `abc` (all text-like commands, nested groups kept balanced)."""
  out, pos = [], 0
  for m in re.finditer(_TEXT_CMD + r"\s*(?=\{)", s):
    if m.start() < pos:
      continue
    group = _braced_group(s, m.end())
    if group is None:
      break
    out.append(s[pos : m.start()])
    out.append(group[0])
    pos = group[1]
  out.append(s[pos:])
  return "".join(out)


def _strip_thousands(s: str) -> str:
  """`1,000` / `1{,}000` -> `1000` when the whole string is one such number (`1, 000` is a list)."""
  t = s.strip().replace("{,}", ",")
  return t.replace(",", "") if _THOUSANDS_RE.match(t) else s


def normalize_integer(s: str) -> str | None:
  r"""Canonical integer string of an AIME-style answer, or None if it is no integer.

  Strips `$`, spaces, thousands separators, `\text{}`, `^\circ`, a leading
  `+` and a trailing `.0`: `$1{,}000$` -> "1000", `070` -> "70", `1,2` -> None.
  """
  if s is None:
    return None
  t = _unwrap_text(str(s)).replace("\\$", "").replace("$", "").replace("\\,", ",")
  t = _DEGREE_RE.sub("", t.replace("\\!", "").replace("\\ ", ""))
  t = re.sub(r"\s+", "", t)
  t = _strip_thousands(t)
  t = re.sub(r"\.0+$", "", t).lstrip("+")
  if not _INTEGER_RE.match(t):
    return None
  digits = t.lstrip("+-").lstrip("0")  # no int(): a 5000-digit answer is still an integer
  return ("-" + digits if t.startswith("-") else digits) if digits else "0"


_UNIT_WORDS = (
  r"(?:square|sq\.?|cubic)?\s*(?:units?|inch(?:es)?|in\.?|feet|foot|ft|yards?|"
  r"miles?|meters?|metres?|cm|mm|km|m|centimeters?|kilometers?|seconds?|minutes?|"
  r"hours?|days?|weeks?|years?|dollars?|cents?|degrees?|radians?|mph|pounds?|"
  r"ounces?|cups?|gallons?|liters?|grams?|kg|people|students|ways|cookies|"
  r"handshakes|games|points?|teams?)"
)
_TEXT_UNIT_RE = re.compile(
  _TEXT_CMD + r"\s*\{\s*" + _UNIT_WORDS + r"\s*\}(\s*\^\s*\{?\d\}?)?", re.IGNORECASE
)
_MATRIX_ROW_RE = re.compile(r"(?<!\\)\\(?=\s*[-+\d.])")
_MATRIX_ENV_RE = re.compile(r"(\\begin\{[pbvBV]?matrix\})(.*?)(\\end\{[pbvBV]?matrix\})", re.DOTALL)


def _fix_matrix_rows(s: str) -> str:
  r"""`\begin{pmatrix}1\2\end{pmatrix}` -> rows split by `\\` (a lost backslash in MATH golds)."""
  return _MATRIX_ENV_RE.sub(
    lambda m: m.group(1) + _MATRIX_ROW_RE.sub(r"\\\\", m.group(2)) + m.group(3), s
  )


def clean_latex(s: str, unit_power: bool = True) -> str:
  r"""Removes notation that does not change the value of a final answer.

  `\dfrac`/`\tfrac`, `\left`/`\right`, `\!`/`\,` spacing, `\displaystyle`,
  `^\circ`, `\%`, `\$`, unit words in `\text{}` (with their power when
  `unit_power`; `15\text{ cm}^2` is `15` vs `15^2` depending on whose gold
  you read), thousands separators, a trailing period and `$` delimiters.
  """
  t = s.strip()
  if t.startswith("$") and t.endswith("$"):
    t = t.strip("$")
  t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  t = re.sub(r"\\left\s*\.|\\right\s*\.", "", t)
  t = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])", "", t)
  t = re.sub(r"\\displaystyle|\\!|\\[,;:]|\\ |~", " ", t)
  t = _DEGREE_RE.sub("", t)
  t = t.replace("\\%", "").replace("%", "").replace("\\$", "")
  t = _TEXT_UNIT_RE.sub("" if unit_power else r"\1", t)
  t = _fix_matrix_rows(t)
  t = t.strip().rstrip(".").strip()
  return _strip_thousands(t).strip()


def _squash(s: str) -> str:
  return re.sub(r"\s+", "", s)


def _as_words(s: str) -> str | None:
  r"""Lower-case words of a text answer (`\text{(C) Evelyn}` -> `(c)evelyn`), None for maths."""
  t = re.sub(r"\\[,;:! ]|~", " ", _unwrap_text(s).replace("$", "")).strip().rstrip(".")
  choice = re.match(r"^\(?([A-Za-z])\)?$", t)  # multiple choice: (C) / C
  if choice:
    return choice.group(1).lower()
  if "\\" in t or not re.search(r"[A-Za-z]{2,}", t):
    return None
  return _squash(t).lower()


# ----------------------------------------------------------------------------
# Equivalence
# ----------------------------------------------------------------------------


def _quick_verdict(pred: str | None, gold: str, integer_answers: bool) -> bool | None:
  """Decision without sympy where strings settle it; None means "ask math-verify"."""
  if not pred:
    return False
  if _squash(pred) == _squash(gold):
    return True
  gold_int = normalize_integer(gold)
  if gold_int is not None:
    pred_int = normalize_integer(pred)
    if integer_answers or pred_int is not None:  # two integers: equal or not, no sympy needed
      return pred_int == gold_int
  return None


_PARSED: collections.OrderedDict = collections.OrderedDict()  # per process: latex -> parse
_PARSED_MAX = 4096


def _mv_parse(latex: str, timeout: int):
  """math-verify parse of a bare answer; golds parse reliably only when wrapped.

  Parsing (antlr) is most of math-verify's time and a gold is judged against
  every response of its group, so successful parses are kept (LRU).
  """
  if latex in _PARSED:
    _PARSED.move_to_end(latex)
    return _PARSED[latex]
  from math_verify import parse

  for wrapped in (f"\\boxed{{{latex}}}", f"${latex}$"):
    parsed = parse(wrapped, parsing_timeout=timeout)
    if parsed:
      _PARSED[latex] = parsed
      if len(_PARSED) > _PARSED_MAX:
        _PARSED.popitem(last=False)
      return parsed
  return []


def is_equivalent(
  pred: str, gold: str, integer_answers: bool = False, timeout_s: float = 5.0
) -> bool:
  r"""Whether answer `pred` means the same as reference `gold` (both bare LaTeX).

  Strings first (identical, integer-normalised, cleaned, or the same words
  case-insensitively), then math-verify `verify(parse(gold), parse(pred))` on
  the cleaned forms. math-verify's own `signal.alarm` timeouts bound each step,
  so call this in a process's main thread (a `RewardPool` worker); the whole
  call gives up once `timeout_s` has passed.
  """
  quick = _quick_verdict(pred, gold, integer_answers)
  if quick is not None:
    return quick
  gold_clean = clean_latex(gold)
  preds = list(dict.fromkeys([clean_latex(pred), clean_latex(pred, unit_power=False)]))
  if any(_squash(p) == _squash(gold_clean) for p in preds):
    return True
  gold_words = _as_words(gold)
  if gold_words is not None and any(_as_words(p) == gold_words for p in [pred, *preds]):
    return True
  from math_verify import verify

  deadline = time.monotonic() + timeout_s

  def budget() -> int | None:
    """Whole seconds left for the next math-verify step (signal.alarm takes ints)."""
    left = deadline - time.monotonic()
    return None if left <= 0 else max(1, math.ceil(left))

  gold_parsed = _mv_parse(gold_clean, budget())
  for p in preds:
    if not gold_parsed or (t := budget()) is None:
      return False
    pred_parsed = _mv_parse(p, t)
    if (t := budget()) is None:
      return False
    if pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=t):
      return True
  return False


def is_well_formed(extracted: str | None, integer_answers: bool) -> bool:
  """A final answer is present (and, for integer tasks, is an integer)."""
  if not extracted:
    return False
  return normalize_integer(extracted) is not None if integer_answers else True
