"""The program of a response: its last fenced python block, or the whole text."""

from __future__ import annotations

import re

from rlvr.rewards.code.config import CODE_EXTRACTIONS
from rlvr.rewards.extraction import after_thinking

_CODE_TAGS = ("", "python", "python3", "py")
_SPACE = re.compile(r"\s")


def _fence(line: str) -> str | None:
  """The info string of a fence line (```, then one word or none; spaces and tabs around),
  "" for a bare fence; None when the line is no fence."""
  rest = line.lstrip(" \t")
  if not rest.startswith("```"):
    return None
  info = rest[3:].strip(" \t")
  return None if _SPACE.search(info) else info


def last_python_block(text: str) -> str | None:
  """Body of the last closed ```python (or untagged) block; None when there is none.

  One pass over the lines: a fence line opens a block, the next bare fence line closes it,
  so the body of a ```text block is never read as code; a block cut off by the length limit
  has no closing fence and does not count. Time is linear in the text, however it is built.
  """
  found, tag, start = None, None, 0
  lines = text.split("\n")
  offset = 0  # where the current line starts
  for i, line in enumerate(lines):
    info = _fence(line)
    if tag is None:
      if info is not None and i < len(lines) - 1:  # an opening fence ends with its newline
        tag, start = info, offset + len(line) + 1
    elif info == "":
      if tag.lower() in _CODE_TAGS:
        found = text[start:offset]
      tag = None
    offset += len(line) + 1
  return found


def extract_program(text: str, mode: str = "last_block") -> str | None:
  """The program to run ("last_block" | "whole"), after any `</think>`; None if empty."""
  if mode not in CODE_EXTRACTIONS:
    raise ValueError(f"mode: unknown {mode!r}; expected one of {CODE_EXTRACTIONS}")
  text = after_thinking(text)
  program = last_python_block(text) if mode == "last_block" else text
  return program if program and program.strip() else None
