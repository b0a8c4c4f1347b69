"""Numbers as problems and answers write them, read exactly (`Fraction`), and the names a
composed problem's new variables may take; pure, for Composition-RL's checks."""

from __future__ import annotations

import re
from fractions import Fraction

# A decimal as written: digits, with commas only where they group thousands (every group
# after the first has exactly three digits: "1,000" and "12,345,678", not "2,3" or
# "1,200,3"), then an optional decimal part.
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+(?!,?\d)|\d+)(?:\.\d+)?"
_MINUS = "-\u2212"  # the hyphen-minus and the Unicode minus sign
_FRAC_ARG = rf"\{{\s*[{_MINUS}]?{_DECIMAL}\s*\}}|\d"  # "{-3}", "{1,000}" or one digit
_NUMBER = re.compile(
  rf"(?P<sign>[{_MINUS}])?"
  rf"(?:\\[dt]?frac\s*(?P<num>{_FRAC_ARG})\s*(?P<den>{_FRAC_ARG})"
  rf"|(?P<plain>{_DECIMAL})(?:/(?P<over>{_DECIMAL}))?)"
)
# LaTeX relations and operators: a minus after one of them is a sign ("x \le -3").
_OPERATOR_COMMANDS = frozenset(
  {
    "le",
    "leq",
    "ge",
    "geq",
    "lt",
    "gt",
    "ne",
    "neq",
    "approx",
    "equiv",
    "cdot",
    "times",
    "div",
    "pm",
    "mp",
    "to",
    "in",
    "quad",
    "qquad",
  }
)


def _exact(written: str) -> Fraction:
  """The value of a decimal or braced \\frac argument as written: "{-1,000.5}" -> -2001/2."""
  return Fraction(written.strip("{}").strip().replace(",", "").replace("\u2212", "-"))


def _magnitude(m: re.Match) -> Fraction | None:
  """The value of a _NUMBER match without its leading sign; None for a zero denominator."""
  if m["num"] is not None:
    num, den = _exact(m["num"]), _exact(m["den"])
  else:
    num, den = _exact(m["plain"]), _exact(m["over"] or "1")
  return num / den if den else None


def _is_sign(text: str, i: int) -> bool:
  """Whether the minus at text[i] makes the number after it negative.

  Right after an operand (spaces skipped) the minus subtracts: after a digit, a closing
  bracket, "!", "%", a one-letter variable or a LaTeX symbol such as \\pi, so "2x-7",
  "5 - 3" and "2\\pi-3" hold 7, 3 and 3. Anywhere else it is a sign: at the start, after
  "=", "(", ",", another operator, a word ("2 and -3") or a LaTeX relation or operator
  command: "-7", "x = -3", "(-2, 5)", "5 - -3", "x \\le -3". (A product of letters
  reads as a word: "xy-3" holds -3.)
  """
  while i > 0 and text[i - 1].isspace():
    i -= 1
  if i == 0:
    return True
  word = i
  while word > 0 and text[word - 1].isalpha():
    word -= 1
  if word < i:
    if word > 0 and text[word - 1] == "\\":
      return text[word:i] in _OPERATOR_COMMANDS
    return i - word > 1
  return not (text[i - 1].isdigit() or text[i - 1] in ")]}!%")


def parse_number(s: str | None) -> Fraction | None:
  """The exact number a whole string states, else None.

  Reads "12", "-3.5", "1,000", "3/4", "\\frac{3}{4}", "-\\dfrac{1}{2}", "\\frac12" and
  "$12$". Spaces are dropped except after a comma, which separates numbers: "2, 3",
  "(2,3)" and "5-3" state no single number.
  """
  if s is None:
    return None
  s = s.strip().strip("$")
  for markup in ("\\!", "\\left", "\\right"):
    s = s.replace(markup, "")
  s = re.sub(r"(?<!,)\s+", "", s.replace("{,}", ","))
  m = _NUMBER.fullmatch(s)
  value = _magnitude(m) if m else None
  return -value if value is not None and m["sign"] else value


def numbers_in(text: str) -> list[Fraction]:
  """Every number written in a text, in order of writing.

  Each is read as parse_number reads it, with two rules for running text: a minus is a
  sign only where _is_sign says so ("5-3" holds 5 and 3, "x = -\\frac{1}{2}" holds -1/2),
  and a comma that does not group thousands separates numbers ("(2,3)" holds 2 and 3,
  "1,000" holds 1000). A fraction with a zero denominator is no number.
  """
  text = text.replace("{,}", ",")
  out = []
  for m in _NUMBER.finditer(text):
    value = _magnitude(m)
    if value is not None:
      out.append(-value if m["sign"] and _is_sign(text, m.start()) else value)
  return out


def default_equivalent(a: str, b: str) -> bool:
  """Exact numeric equality when both parse, else equal text."""
  x, y = parse_number(a), parse_number(b)
  return x == y if x is not None and y is not None else a.strip() == b.strip()


def clashes(name: str, *texts: str) -> bool:
  """Whether `name` already stands as a symbol in any text (not inside a longer word)."""
  pattern = rf"(?<![A-Za-z\\]){re.escape(name)}(?![A-Za-z])"
  return any(re.search(pattern, t) for t in texts)


def symbols(text: str) -> list[str]:
  """Single letters standing alone in a text (the names a new variable must avoid)."""
  return sorted(set(re.findall(r"(?<![A-Za-z\\])[A-Za-z](?![A-Za-z])", text)))


def valid_name(name: str | None) -> bool:
  return bool(name) and re.fullmatch(r"[A-Za-z](?:_?\w{0,2})?", name) is not None


def format_number(v: Fraction) -> str:
  return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
