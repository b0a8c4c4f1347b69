"""The rows of a dataset file as its format reads them (JSONL, a JSON array, parquet), each
with its row index and, for a row that cannot be read, why; and how messages name a row.

A row is named by its 0-based row index (`readers.Example.index`,
`readers.Dataset.bad_rows`): the array index in a JSON file, the row number in a parquet
file, the 0-based line number in a JSONL file (blank lines count). Messages spell it out,
"row index 3", and for JSONL also give the 1-based line an editor shows: "line 4 (row
index 3)".
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any


class DatasetError(ValueError):
  """A dataset file that cannot be used: bad format, bad row (on_bad_row="error"), no valid row."""


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
