"""QbQ's artifacts: one JSONL file per round and stage under `<workdir>/qbq/round_XX/`.

A stage's file is written whole and atomically (by the writing process only), so
it exists only once the stage finished; `stage` loads it when it exists and
computes it otherwise, which is how a resumed run skips finished stages.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Callable, Mapping, Sequence

from rlvr.common import fileio
from rlvr.parallel import distributed
from synthesis import qbq

read_jsonl = fileio.read_jsonl


def write_jsonl(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  """Whole file, atomically; only the writing process writes (multi-host)."""
  if distributed.is_writer():
    fileio.write_jsonl(path, rows)


def as_variant(row: Mapping[str, Any]) -> qbq.Variant:
  """A stored row (seed, variant, scored or selected) as a Variant."""
  return qbq.Variant(
    row["id"],
    row.get("parent_id", ""),
    row.get("operator", ""),
    row["problem"],
    str(row["answer"]),
    row.get("n"),
  )


class RoundStore:
  """The artifacts of one run's rounds, under `<workdir>/qbq`."""

  def __init__(self, workdir: str):
    self.dir = os.path.join(workdir, "qbq")

  def path(self, t: int, name: str) -> str:
    return os.path.join(self.dir, f"round_{t:02d}", name)

  def read(self, t: int, name: str) -> list[dict]:
    return read_jsonl(self.path(t, name))

  def write(self, t: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
    write_jsonl(self.path(t, name), rows)

  def stage(self, t: int, name: str, compute: Callable[[], list[dict]]) -> list[dict]:
    """The artifact of a finished stage, else compute and write it."""
    if os.path.exists(self.path(t, name)):
      return self.read(t, name)
    rows = compute()
    self.write(t, name, rows)
    return rows

  def selections(self) -> list[dict]:
    """Every round's selection, in round order ([] when no round got that far)."""
    paths = sorted(glob.glob(os.path.join(self.dir, "round_*", "selection.jsonl")))
    return [r for p in paths for r in read_jsonl(p)]
