"""The file writes every part of a run shares: atomic replacement, JSON and JSONL.

A file written with `atomic_open` appears at its path only once the block that writes
it ends without an error (a temporary beside it, then `os.replace`), so a killed run
never leaves a half-written checkpoint index, report or weight file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, Mapping, Sequence


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[Any]:
  """A file open for writing that replaces `path` when the block ends without an error."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, mode) as f:
      yield f
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise
  os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
  with atomic_open(path) as f:
    json.dump(obj, f, indent=2)


def read_jsonl(path: str) -> list[dict]:
  """The rows of a JSONL file (blank lines skipped)."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  """The whole file at once, atomically."""
  with atomic_open(path) as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
