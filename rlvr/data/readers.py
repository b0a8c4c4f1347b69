"""Datasets of (problem, answer) rows, read from verl parquet, jsonl and json files.

Math RL sets come in a few layouts (docs/architecture.md#data-formats): verl
parquet with chat messages and `reward_model.ground_truth`, jsonl with
{question, ref_answer} or {problem, answer}, and JSON arrays. All of them
become `Example`s here, so the rest of the library sees one shape. Bad rows are
skipped and reported rather than silently dropped: a reward computed against an
empty answer is worse than a smaller dataset.

A row that is not valid UTF-8, whose text holds a lone surrogate escape ("\\ud800"),
whose answer is NaN or infinite, that is nested too deep to read or holds a number with
too many digits to read, is a bad row; messages name it by its row index
(`raw_rows.row_label`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlvr.data import raw_rows

log = logging.getLogger(__name__)

PROBLEM_FIELDS = ("problem", "question", "prompt")
# The last two hold a code problem's tests (Apps' `input_output`; reward.domain = "code").
ANSWER_FIELDS = (
  "answer",
  "ref_answer",
  "ground_truth",
  "reward_model.ground_truth",
  "input_output",
  "tests",
)
# verl eval sets keep the human-written reference solution in extra_info.answer.
SOLUTION_FIELDS = ("solution", "extra_info.answer")
SOURCE_FIELDS = ("data_source", "source")
BAD_ROW_POLICIES = ("skip", "error")
_SHOWN_BAD_ROWS = 5


@dataclasses.dataclass(frozen=True)
class Example:
  """One problem with its verifiable answer; `index` is the row index in its file, `path`
  that file ("" for a problem made in code)."""

  problem: str
  answer: str
  source: str = ""
  index: int = -1
  solution: str | None = None
  path: str = ""
  # The row's other columns, as read (a file's row less its problem): what a reward
  # function of the user's may take (TRL's keyword columns, verl's `extra_info`).
  columns: Mapping[str, Any] = dataclasses.field(
    default_factory=dict, compare=False, hash=False, repr=False
  )

  def where(self) -> str:
    """How messages name the row: "set.jsonl: line 4 (row index 3)"; "row index 3" for a
    problem made in code."""
    if not self.path:
      return f"row index {self.index}"
    return f"{self.path}: {raw_rows.row_label(self.path, self.index)}"


@dataclasses.dataclass(frozen=True)
class Dataset:
  """The valid examples of one file plus the (row index, reason) of every skipped row."""

  examples: tuple[Example, ...]
  bad_rows: tuple[tuple[int, str], ...]
  path: str

  def where(self, index: int) -> str:
    """Where row `index` is, as messages name it ("line 4 (row index 3)" in JSONL)."""
    return raw_rows.row_label(self.path, index)

  def __len__(self) -> int:
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]

  def __iter__(self) -> Iterator[Example]:
    return iter(self.examples)


# ------------------------------------------------------------------ fields
def _lookup(row: Mapping, field: str) -> Any:
  """row[field], where a dotted field walks nested dicts; None when absent."""
  if field in row:
    return row[field]
  value: Any = row
  for part in field.split("."):
    if not isinstance(value, Mapping) or part not in value:
      return None
    value = value[part]
  return value


def _first_field(row: Mapping, fields: Sequence[str]) -> tuple[str | None, Any]:
  """(the first of `fields` the row holds, its value); (None, None) for none."""
  for field in fields:
    value = _lookup(row, field)
    if value is not None:
      return field, value
  return None, None


def _first_present(row: Mapping, fields: Sequence[str]) -> Any:
  return _first_field(row, fields)[1]


def _problem_text(value: Any) -> str | None:
  """A problem is a string, or chat messages whose last user message holds it (verl)."""
  if isinstance(value, str):
    return value
  if isinstance(value, Sequence):
    users = [m for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
    if users and isinstance(users[-1].get("content"), str):
      return users[-1]["content"]
  return None


def _answer_text(value: Any) -> str | None:
  """Answers are compared as text; JSON numbers (AIME's ints) become their decimal string,
  and an object or list (a code problem's tests) its JSON text."""
  if isinstance(value, bool):
    return None
  if isinstance(value, str):
    return value
  if isinstance(value, (Mapping, list)):
    return json.dumps(value)
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    return str(int(value)) if value.is_integer() else repr(value)
  return None


def _finite_or_text(answer: str) -> bool:
  """False for an answer that reads as a NaN or infinite float ("NaN", "-inf",
  "Infinity", "1e400", or a JSON number beyond float range); no reward can match it."""
  try:
    return math.isfinite(float(answer))
  except ValueError:
    return True


# A UTF-16 surrogate on its own: what JSON's "\ud800" escape decodes to.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _to_example(
  row: Any, index: int, problem_fields, answer_fields, default_source: str, path: str = ""
) -> Example | str:
  """The row's Example, or the reason it is bad."""
  if not isinstance(row, Mapping):
    return f"not an object ({type(row).__name__})"
  problem_key, raw_problem = _first_field(row, problem_fields)
  if raw_problem is None:
    return f"missing problem (tried {', '.join(problem_fields)})"
  problem = _problem_text(raw_problem)
  if problem is None:
    return (
      f"problem is neither text nor chat messages with a user turn ({type(raw_problem).__name__})"
    )
  if not problem.strip():
    return "empty problem"
  raw_answer = _first_present(row, answer_fields)
  if raw_answer is None:
    return f"missing answer (tried {', '.join(answer_fields)})"
  answer = _answer_text(raw_answer)
  if answer is None:
    return f"answer has unsupported type {type(raw_answer).__name__}"
  if not answer.strip():
    return "empty answer"
  if not _finite_or_text(answer):
    return f"answer is not a finite number ({raw_answer!r})"
  solution = _first_present(row, SOLUTION_FIELDS)
  source = _first_present(row, SOURCE_FIELDS)
  example = Example(
    problem=problem,
    answer=answer.strip(),
    source=source if isinstance(source, str) else default_source,
    index=index,
    solution=solution if isinstance(solution, str) and solution.strip() else None,
    path=path,
    columns={k: v for k, v in row.items() if k != problem_key},
  )
  for name in ("problem", "answer", "solution", "source"):
    bad = _SURROGATE.search(getattr(example, name) or "")
    if bad:  # no UTF-8 spelling: a tokenizer or a UTF-8 file cannot take it
      return f"{name} holds a lone surrogate (\\u{ord(bad.group()):04x}), which is not text"
  return example


def _summary(path: str, bad_rows: Sequence[tuple[int, str]]) -> str:
  shown = "; ".join(
    f"{raw_rows.row_label(path, i)}: {reason}" for i, reason in bad_rows[:_SHOWN_BAD_ROWS]
  )
  more = f"; ... {len(bad_rows) - _SHOWN_BAD_ROWS} more" if len(bad_rows) > _SHOWN_BAD_ROWS else ""
  return shown + more


def read_dataset(
  path: str,
  *,
  problem_field: str | None = None,
  answer_field: str | None = None,
  on_bad_row: str = "skip",
  limit: int | None = None,
) -> Dataset:
  """Reads a .parquet / .jsonl / .json file of math problems into a `Dataset`.

  problem_field / answer_field: a (dotted) field name; by default the first
  present of PROBLEM_FIELDS / ANSWER_FIELDS. A row with a missing or empty
  problem or answer, a NaN or infinite answer, an unparseable JSON line, bytes
  that are not UTF-8, a lone surrogate, nesting too deep or a number too long to read
  is skipped and listed in `bad_rows` (on_bad_row="skip"), or
  raises raw_rows.DatasetError naming the file and the row (on_bad_row="error"), e.g.
  "set.jsonl: line 4 (row index 3): invalid JSON (...)".
  limit: stop after this many valid examples.
  """
  if on_bad_row not in BAD_ROW_POLICIES:
    raise ValueError(f"on_bad_row: unknown {on_bad_row!r}; expected one of {BAD_ROW_POLICIES}")
  if limit is not None and limit < 1:
    raise ValueError(f"limit: must be a positive number of examples, got {limit}")
  ext = os.path.splitext(path)[1].lower()
  if ext not in raw_rows._READERS:
    raise raw_rows.DatasetError(
      f"{path}: unsupported extension {ext!r}; expected one of {sorted(raw_rows._READERS)}"
    )
  problem_fields = (problem_field,) if problem_field else PROBLEM_FIELDS
  answer_fields = (answer_field,) if answer_field else ANSWER_FIELDS
  default_source = os.path.splitext(os.path.basename(path))[0]
  examples, bad_rows, num_rows = [], [], 0
  for index, row, error in raw_rows._READERS[ext](path):
    num_rows += 1
    try:
      result = error or _to_example(row, index, problem_fields, answer_fields, default_source, path)
    except RecursionError as e:  # an answer nested almost too deep to decode, to encode
      result = raw_rows._unreadable(e)
    if isinstance(result, Example):
      examples.append(result)
      if limit is not None and len(examples) >= limit:
        break
      continue
    if on_bad_row == "error":
      raise raw_rows.DatasetError(f"{path}: {raw_rows.row_label(path, index)}: {result}")
    bad_rows.append((index, result))
  if not examples:
    raise raw_rows.DatasetError(
      f"{path}: no valid row among {num_rows} rows"
      + (f"; {_summary(path, bad_rows)}" if bad_rows else "")
    )
  if bad_rows:
    log.warning(
      "read_dataset(%s): skipped %d of %d rows (%s)",
      path,
      len(bad_rows),
      num_rows,
      _summary(path, bad_rows),
    )
  return Dataset(examples=tuple(examples), bad_rows=tuple(bad_rows), path=path)
