"""Datasets of (problem, answer) rows, read from verl parquet, jsonl and json files.

Math RL sets come in a few layouts (docs/architecture.md#data-formats): verl
parquet with chat messages and `reward_model.ground_truth`, jsonl with
{question, ref_answer} or {problem, answer}, and JSON arrays. All of them
become `Example`s here, so the rest of the library sees one shape. Bad rows are
skipped and reported rather than silently dropped: a reward computed against an
empty answer is worse than a smaller dataset.

A row is named by its 0-based row index (`Example.index`, `Dataset.bad_rows`): the
array index in a JSON file, the row number in a parquet file, the 0-based line
number in a JSONL file (blank lines count). Messages spell it out, "row index 3", and
for JSONL also give the 1-based line an editor shows: "line 4 (row index 3)".
A row that is not valid UTF-8, whose text holds a lone surrogate escape ("\\ud800"),
whose answer is NaN or infinite, that is nested too deep to read or holds a number with
too many digits to read, is a bad row.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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


class DatasetError(ValueError):
  """A dataset file that cannot be used: bad format, bad row (on_bad_row="error"), no valid row."""


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
    return f"{self.path}: {row_label(self.path, self.index)}"


@dataclasses.dataclass(frozen=True)
class Dataset:
  """The valid examples of one file plus the (row index, reason) of every skipped row."""

  examples: tuple[Example, ...]
  bad_rows: tuple[tuple[int, str], ...]
  path: str

  def where(self, index: int) -> str:
    """Where row `index` is, as messages name it ("line 4 (row index 3)" in JSONL)."""
    return row_label(self.path, index)

  def __len__(self) -> int:
    return len(self.examples)

  def __getitem__(self, i):
    return self.examples[i]

  def __iter__(self) -> Iterator[Example]:
    return iter(self.examples)


# ------------------------------------------------------------------ raw rows
def row_label(path: str, index: int) -> str:
  """How messages name row `index` of `path`: "line 4 (row index 3)" in a JSONL file
  (its row index is the 0-based line number), "row index 3" elsewhere."""
  if os.path.splitext(path)[1].lower() == ".jsonl":
    return f"line {index + 1} (row index {index})"
  return f"row index {index}"


def _bad_utf8(byte: int, at: str = "") -> str:
  return f"not valid UTF-8 (byte 0x{byte:02x}{' ' + at if at else ''})"


def _jsonl_rows(path: str) -> Iterator[tuple[int, Any, str | None]]:
  """(row index = 0-based line number, object, error); blank lines are not rows.
  Each line is decoded on its own, so one bad byte costs one row."""
  with open(path, "rb") as f:
    for i, raw in enumerate(f):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        column = len(raw[: e.start].decode("utf-8")) + 1  # in characters, as editors count
        yield i, None, _bad_utf8(raw[e.start], f"at column {column}")
        continue
      if not line.strip():
        continue
      try:
        yield i, json.loads(line), None
      except json.JSONDecodeError as e:
        yield i, None, f"invalid JSON ({e.msg} at column {e.colno})"
      except (RecursionError, ValueError) as e:
        yield i, None, _unreadable(e)


def _unreadable(error: RecursionError | ValueError) -> str:
  """Why JSON that parses cannot be read: nested too deep for Python's recursion limit
  (RecursionError), or an integer past Python's digit limit (the ValueError json raises)."""
  if isinstance(error, RecursionError):
    return "nested too deep to read (arrays or objects within each other)"
  limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
  return f"a number with too many digits to read (more than {limit})"


# A byte that is not UTF-8, as decoding with errors="surrogateescape" keeps it.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
# A string, a bracket, a comma, or a run of anything else: enough to find where an element
# of a JSON array ends without decoding it.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]|[^"\[\]{},]+')


def _line_col(text: str, pos: int) -> str:
  """Where character `pos` of `text` is: "at line L, column C" (both 1-based)."""
  line, column = text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)
  return f"at line {line}, column {column}"


def _element_end(text: str, pos: int) -> int:
  """Where the array element starting at `pos` ends (its "," or the array's "]"), found by
  counting brackets, not by decoding: an element nested too deep to decode has an end too."""
  depth = 0
  for token in _JSON_TOKEN.finditer(text, pos):
    t = token.group()
    if t in "[{":
      depth += 1
    elif t in "]}," and depth == 0:
      return token.start()
    elif t in "]}":
      depth -= 1
  return len(text)


def _array_spans(text: str) -> list[tuple[int, int]]:
  """(start, end) of each element of `text`, a JSON array (raises ValueError if not one)."""
  pos, spans = _JSON_SPACE.match(text).end(), []
  if not text.startswith("[", pos):
    raise ValueError("not an array")
  pos = _JSON_SPACE.match(text, pos + 1).end()
  if text.startswith("]", pos):
    return spans
  while pos < len(text):
    end = _element_end(text, pos)
    spans.append((pos, end))
    if text.startswith("]", end):
      return spans
    pos = _JSON_SPACE.match(text, end + 1).end()
  raise ValueError("unterminated array")


def _json_rows(path: str) -> Iterator[tuple[int, Any, str | None]]:
  """(array index, object, error). An element with bytes that are not UTF-8 inside a string
  (named with the byte's line and column), nested too deep or with a number too long to read
  is a bad row; any other invalid JSON, or a file that is not an array, is a bad file."""
  with open(path, encoding="utf-8", errors="surrogateescape") as f:
    text = f.read()
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    bad = _ESCAPED_BYTE.match(text, e.pos)
    why = _bad_utf8(ord(bad.group()) - 0xDC00) if bad else e.msg
    raise DatasetError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {why}") from e
  except (RecursionError, ValueError):
    data = None  # an element json cannot read: decode element by element below
  if data is not None and not isinstance(data, list):
    raise DatasetError(f"{path}: expected a JSON array of objects, got {type(data).__name__}")
  if data is not None and not _ESCAPED_BYTE.search(text):
    yield from ((i, row, None) for i, row in enumerate(data))
    return
  try:
    spans = _array_spans(text)
  except ValueError:
    raise DatasetError(f"{path}: expected a JSON array of objects") from None
  for i, (start, end) in enumerate(spans):
    bad = _ESCAPED_BYTE.search(text, start, end)
    if bad:
      yield i, None, _bad_utf8(ord(bad.group()) - 0xDC00, _line_col(text, bad.start()))
    elif data is not None:
      yield i, data[i], None
    else:
      yield (i, *_decode_element(path, text, start, end))


def _decode_element(path: str, text: str, start: int, end: int) -> tuple[Any, str | None]:
  """(object, None) or (None, why it cannot be read) for the array element text[start:end]."""
  try:
    row, stop = json.JSONDecoder().raw_decode(text, start)
  except json.JSONDecodeError as e:
    raise DatasetError(f"{path}: invalid JSON {_line_col(text, e.pos)}: {e.msg}") from e
  except (RecursionError, ValueError) as e:
    return None, _unreadable(e)
  if _JSON_SPACE.match(text, stop).end() != end:
    raise DatasetError(f"{path}: invalid JSON {_line_col(text, stop)}: expected ',' or ']'")
  return row, None


_PARQUET_CHUNK = 1024


def _parquet_rows(path: str) -> Iterator[tuple[int, Any, str | None]]:
  """(row number, object, error). A string cell that is not UTF-8 makes its row bad
  (named with its column); the other rows of its chunk are converted one at a time.
  Nesting is the schema's, the same for every row: too deep (parquet reads at most 100
  levels) makes the file bad."""
  import pyarrow as pa  # only parquet readers pay for the import
  import pyarrow.parquet as pq

  try:
    table = pq.read_table(path)
  except (FileNotFoundError, PermissionError):
    raise
  except (OSError, pa.ArrowException) as e:  # not parquet, cut short, a schema nested too deep
    why = str(e).removeprefix(f"Could not open Parquet input source '{path}': ")
    raise DatasetError(f"{path}: not a parquet file that can be read ({why})") from e
  for start in range(0, table.num_rows, _PARQUET_CHUNK):
    chunk = table.slice(start, _PARQUET_CHUNK)
    try:
      rows = chunk.to_pylist()
    except UnicodeDecodeError:
      rows = None
    for i in range(chunk.num_rows):
      if rows is not None:
        yield start + i, rows[i], None
        continue
      one = chunk.slice(i, 1)
      try:
        row, error = one.to_pylist()[0], None
      except UnicodeDecodeError:
        row, error = None, _parquet_bad_cell(one)
      yield start + i, row, error


def _parquet_bad_cell(row) -> str:
  for name in row.column_names:
    try:
      row.column(name).to_pylist()
    except UnicodeDecodeError as e:
      return _bad_utf8(e.object[e.start], f"in column {name!r}")
  return "not valid UTF-8"


_READERS = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}


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
  shown = "; ".join(f"{row_label(path, i)}: {reason}" for i, reason in bad_rows[:_SHOWN_BAD_ROWS])
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
  raises DatasetError naming the file and the row (on_bad_row="error"), e.g.
  "set.jsonl: line 4 (row index 3): invalid JSON (...)".
  limit: stop after this many valid examples.
  """
  if on_bad_row not in BAD_ROW_POLICIES:
    raise ValueError(f"on_bad_row: unknown {on_bad_row!r}; expected one of {BAD_ROW_POLICIES}")
  if limit is not None and limit < 1:
    raise ValueError(f"limit: must be a positive number of examples, got {limit}")
  ext = os.path.splitext(path)[1].lower()
  if ext not in _READERS:
    raise DatasetError(f"{path}: unsupported extension {ext!r}; expected one of {sorted(_READERS)}")
  problem_fields = (problem_field,) if problem_field else PROBLEM_FIELDS
  answer_fields = (answer_field,) if answer_field else ANSWER_FIELDS
  default_source = os.path.splitext(os.path.basename(path))[0]
  examples, bad_rows, num_rows = [], [], 0
  for index, row, error in _READERS[ext](path):
    num_rows += 1
    try:
      result = error or _to_example(row, index, problem_fields, answer_fields, default_source, path)
    except RecursionError as e:  # an answer nested almost too deep to decode, to encode
      result = _unreadable(e)
    if isinstance(result, Example):
      examples.append(result)
      if limit is not None and len(examples) >= limit:
        break
      continue
    if on_bad_row == "error":
      raise DatasetError(f"{path}: {row_label(path, index)}: {result}")
    bad_rows.append((index, result))
  if not examples:
    raise DatasetError(
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
