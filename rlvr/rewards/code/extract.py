"""The program of a response: its last fenced python block, or the whole text."""

from __future__ import annotations

import re

from rlvr.rewards.code.config import CODE_EXTRACTIONS
from rlvr.rewards.extraction import after_thinking

# A closed fence with its info string; only python, python3, py or none is code of ours.
_FENCE_RE = re.compile(
  r"^[ \t]*```[ \t]*(\S*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL
)


def last_python_block(text: str) -> str | None:
  """Body of the last closed ```python (or untagged) block; None when there is none.

  Fences are matched in order, so the body of a ```text block is never read as code;
  a block cut off by the length limit has no closing fence and does not count.
  """
  found = None
  for m in _FENCE_RE.finditer(text):
    tag = m.group(1).lower()
    if tag in ("", "python", "python3", "py"):
      found = m.group(2)
  return found


def extract_program(text: str, mode: str = "last_block") -> str | None:
  """The program to run ("last_block" | "whole"), after any `</think>`; None if empty."""
  if mode not in CODE_EXTRACTIONS:
    raise ValueError(f"mode: unknown {mode!r}; expected one of {CODE_EXTRACTIONS}")
  text = after_thinking(text)
  program = last_python_block(text) if mode == "last_block" else text
  return program if program and program.strip() else None
