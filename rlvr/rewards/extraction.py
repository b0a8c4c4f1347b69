r"""Answer extraction: the final answer of a response, as bare LaTeX.

Only the last `\boxed{}` (or `Answer: ...` line) after any `</think>` counts,
and a box cut off by the length limit yields None, so a truncated response
never scores. Pure functions; they run in the caller.
"""

from __future__ import annotations

import re

EXTRACTIONS = ("boxed", "answer_line")

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
        return text[start + 1 : i], i + 1
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
  if rest < len(text) and text[rest] in " \t":  # `\boxed 5`: one token
    token = re.match(r"[^\s$]+", stripped)
    return token.group(0).rstrip(".,;") if token else None
  return None


_ANSWER_LINE_RE = re.compile(
  r"^[ \t>#*_]*answer[ \t*_]*:[ \t*_]*(.*?)[ \t*_]*$", re.IGNORECASE | re.MULTILINE
)


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
  return text if cut < 0 else text[cut + len(_THINK_END) :]


def extract_answer(text: str, mode: str = "boxed") -> str | None:
  """Final answer of a response by `mode` ("boxed" | "answer_line"); None if absent or empty."""
  if mode == "boxed":
    answer = extract_boxed(after_thinking(text))
  elif mode == "answer_line":
    answer = extract_answer_line(after_thinking(text))
  else:
    raise ValueError(f"mode: unknown {mode!r}; expected one of {EXTRACTIONS}")
  return answer or None
