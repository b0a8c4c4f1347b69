"""Verifiable rewards: answer extraction, math-verify equivalence, a hang-proof pool.

A response earns `correct` (1/0: its final answer matches the reference) plus
`format_bonus` when it states a well-formed final answer (QbQ: 0.1 for a boxed
integer). Extraction and string normalisation are pure functions that run in
the caller; math-verify (sympy) runs in worker processes because a single
pathological answer (`9^{9^{9^{9}}}`, `(10^8)!`) can hold a CPU for minutes and
its own timeouts use `signal.alarm`, which works only in a process's main
thread. `RewardPool` (rlvr/reward_pool.py) kills and replaces a worker whose
item overruns its time (or that dies), scores that item 0, and carries on.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import time
from typing import Sequence

import numpy as np

EXTRACTIONS = ("boxed", "answer_line")

# ----------------------------------------------------------------------------
# Answer extraction
# ----------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_THINK_END = "</think>"


def _braced_group(text: str, start: int) -> tuple[str, int] | None:
  """Content of the `{...}` group opening at text[start], by brace counting.

  `\\{` and `\\}` are literal braces in LaTeX, so a backslash skips the next
  character. Returns (content, index after the closing brace) or None when
  the group never closes (a truncated response).
  """
  depth = 0
  i = start
  while i < len(text):
    ch = text[i]
    if ch == "\\":
      i += 2
      continue
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1:i], i + 1
    i += 1
  return None


def extract_boxed(text: str) -> str | None:
  r"""Content of the LAST `\boxed{...}` / `\fbox{...}` (or `\boxed 5`), else None.

  Only the last box counts: a model that boxes several candidates is judged
  by its final one. An unbalanced last box (cut off by the length limit) is
  None, not an earlier box, so a truncated response never scores.
  """
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  rest = matches[-1].end()
  stripped = text[rest:].lstrip()
  if stripped.startswith("{"):
    group = _braced_group(text, len(text) - len(stripped))
    return None if group is None else group[0].strip()
  if rest < len(text) and text[rest] in " \t":   # `\boxed 5`: one token
    token = re.match(r"[^\s$]+", stripped)
    return token.group(0).rstrip(".,;") if token else None
  return None


_ANSWER_LINE_RE = re.compile(r"^[ \t>#*_]*answer[ \t*_]*:[ \t*_]*(.*?)[ \t*_]*$",
                             re.IGNORECASE | re.MULTILINE)


def extract_answer_line(text: str) -> str | None:
  """Value of the last `Answer: ...` line (DAPO's output format), else None.

  Markdown emphasis around the label is tolerated (`**Answer:** 5`); `$`
  delimiters and a trailing period are removed; a boxed value is unboxed.
  """
  matches = _ANSWER_LINE_RE.findall(text)
  if not matches:
    return None
  value = matches[-1].strip()
  boxed = extract_boxed(value)
  if boxed is not None:
    return boxed
  value = value.rstrip(".").strip()
  if value.startswith("$") and value.endswith("$"):
    value = value.strip("$").strip()
  elif value.startswith("\\(") and value.endswith("\\)"):
    value = value[2:-2].strip()
  return value.rstrip(".").strip()


def after_thinking(text: str) -> str:
  """Text after the last `</think>`: reasoning models may box drafts while thinking."""
  cut = text.rfind(_THINK_END)
  return text if cut < 0 else text[cut + len(_THINK_END):]


def extract_answer(text: str, mode: str = "boxed") -> str | None:
  """Final answer of a response by `mode` ("boxed" | "answer_line"); None if absent or empty."""
  if mode == "boxed":
    answer = extract_boxed(after_thinking(text))
  elif mode == "answer_line":
    answer = extract_answer_line(after_thinking(text))
  else:
    raise ValueError(f"mode: unknown {mode!r}; expected one of {EXTRACTIONS}")
  return answer or None


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
    out.append(s[pos:m.start()])
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
  return str(int(t))


_UNIT_WORDS = (r"(?:square|sq\.?|cubic)?\s*(?:units?|inch(?:es)?|in\.?|feet|foot|ft|yards?|"
               r"miles?|meters?|metres?|cm|mm|km|m|centimeters?|kilometers?|seconds?|minutes?|"
               r"hours?|days?|weeks?|years?|dollars?|cents?|degrees?|radians?|mph|pounds?|"
               r"ounces?|cups?|gallons?|liters?|grams?|kg|people|students|ways|cookies|"
               r"handshakes|games|points?|teams?)")
_TEXT_UNIT_RE = re.compile(_TEXT_CMD + r"\s*\{\s*" + _UNIT_WORDS + r"\s*\}(\s*\^\s*\{?\d\}?)?",
                           re.IGNORECASE)
_MATRIX_ROW_RE = re.compile(r"(?<!\\)\\(?=\s*[-+\d.])")
_MATRIX_ENV_RE = re.compile(r"(\\begin\{[pbvBV]?matrix\})(.*?)(\\end\{[pbvBV]?matrix\})", re.DOTALL)


def _fix_matrix_rows(s: str) -> str:
  r"""`\begin{pmatrix}1\2\end{pmatrix}` -> rows split by `\\` (a lost backslash in MATH golds)."""
  return _MATRIX_ENV_RE.sub(
      lambda m: m.group(1) + _MATRIX_ROW_RE.sub(r"\\\\", m.group(2)) + m.group(3), s)


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
  choice = re.match(r"^\(?([A-Za-z])\)?$", t)        # multiple choice: (C) / C
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
    if integer_answers or pred_int is not None:   # two integers: equal or not, no sympy needed
      return pred_int == gold_int
  return None


_PARSED: collections.OrderedDict = collections.OrderedDict()   # per process: latex -> parse
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


def is_equivalent(pred: str, gold: str, integer_answers: bool = False,
                  timeout_s: float = 5.0) -> bool:
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


# ----------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How responses are turned into rewards.

  extraction: "boxed" (last `\\boxed{}`) or "answer_line" (last `Answer: ...`).
  integer_answers: answers are integers (AIME, DAPO-17k): compare as integers,
    and only an integer final answer counts as well-formed.
  format_bonus: added to the reward when a well-formed answer is present (QbQ 0.1).
  timeout_s: time one answer may spend in math-verify before it scores 0.
  """
  extraction: str = "boxed"
  integer_answers: bool = False
  format_bonus: float = 0.0
  timeout_s: float = 5.0

  def __post_init__(self):
    if self.extraction not in EXTRACTIONS:
      raise ValueError(f"RewardConfig.extraction: unknown {self.extraction!r}; "
                       f"expected one of {EXTRACTIONS}")
    if not isinstance(self.integer_answers, bool):
      raise TypeError(f"RewardConfig.integer_answers: expected bool, got {self.integer_answers!r}")
    if (isinstance(self.format_bonus, bool) or not isinstance(self.format_bonus, (int, float))
        or not math.isfinite(self.format_bonus)):
      raise ValueError(f"RewardConfig.format_bonus: expected a finite number, "
                       f"got {self.format_bonus!r}")
    if (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
        or not self.timeout_s > 0 or not math.isfinite(self.timeout_s)):
      raise ValueError(f"RewardConfig.timeout_s: expected a positive finite number of seconds, "
                       f"got {self.timeout_s!r}")


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Per-response scores of one `score` call.

  rewards = correct + format_bonus * well_formed, except that an item that
  timed out or crashed its worker scores 0 (correct and well_formed False).
  timeouts / errors count those items.
  """
  rewards: np.ndarray
  correct: np.ndarray
  well_formed: np.ndarray
  extracted: list
  timeouts: int
  errors: int


def is_well_formed(extracted: str | None, integer_answers: bool) -> bool:
  """A final answer is present (and, for integer tasks, is an integer)."""
  if not extracted:
    return False
  return normalize_integer(extracted) is not None if integer_answers else True


def _check_inputs(responses: Sequence[str], answers: Sequence) -> list[str]:
  """Reference answers as strings; clear errors for mismatched lengths and bad rows."""
  if isinstance(responses, str) or isinstance(answers, str):
    raise TypeError("responses, answers: expected sequences of strings, got a single str")
  if len(responses) != len(answers):
    raise ValueError(f"responses / answers: lengths differ ({len(responses)} vs {len(answers)})")
  for i, r in enumerate(responses):
    if not isinstance(r, str):
      raise TypeError(f"responses[{i}]: expected str, got {type(r).__name__}")
  golds = []
  for i, a in enumerate(answers):
    if isinstance(a, bool) or not isinstance(a, (str, int)):
      raise TypeError(f"answers[{i}]: expected str or int, got {type(a).__name__}")
    a = str(a).strip()
    if not a:
      raise ValueError(f"answers[{i}]: empty reference answer")
    golds.append(a)
  return golds


def __getattr__(name):
  # The pool lives in rlvr.reward_pool; `rewards.RewardPool` / `rewards.score` stay valid.
  if name in ("RewardPool", "score"):
    from rlvr import reward_pool
    return getattr(reward_pool, name)
  raise AttributeError(f"module 'rlvr.rewards' has no attribute {name!r}")
