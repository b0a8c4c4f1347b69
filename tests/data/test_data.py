"""Dataset readers on hand-written files with bad rows and on the real public sets."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny_run
from paths import REPO as REPO_ROOT

from rlvr.data import prompts
from rlvr.data.raw_rows import DatasetError
from rlvr.data.readers import read_dataset
from rlvr.data.stream import DataStream

TEST_DATA = os.path.join(REPO_ROOT, "tests", "fixtures")  # slices of the public sets (README there)
DATA_DIR = os.path.join(REPO_ROOT, "data")


# ------------------------------------------------------------- hand-written files
def _write_jsonl(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


@pytest.fixture
def jsonl_file(tmp_path):
  return _write_jsonl(
    tmp_path / "set.jsonl",
    [
      json.dumps({"question": "What is 2+2?", "ref_answer": "4"}),
      json.dumps({"question": "Missing answer here"}),
      json.dumps({"question": "   ", "ref_answer": "1"}),
      '{"question": "broken", "ref_answer": ',
      "",  # a blank line is not a row
      json.dumps({"problem": "AIME style", "answer": 123, "data_source": "AIME"}),
      json.dumps({"question": "Empty answer", "ref_answer": ""}),
    ],
  )


def test_jsonl_skips_and_reports_bad_rows_by_index(jsonl_file, caplog):
  with caplog.at_level(logging.WARNING, logger="rlvr.data.readers"):
    ds = read_dataset(jsonl_file)
  assert [(e.problem, e.answer, e.index) for e in ds] == [
    ("What is 2+2?", "4", 0),
    ("AIME style", "123", 5),
  ]
  assert ds[1].source == "AIME" and ds[0].source == "set"
  assert [i for i, _ in ds.bad_rows] == [1, 2, 3, 6]
  reasons = dict(ds.bad_rows)
  assert reasons[1].startswith("missing answer")
  assert reasons[2] == "empty problem"
  assert reasons[3].startswith("invalid JSON")
  assert reasons[6] == "empty answer"
  assert ds.where(3) == "line 4 (row index 3)"
  warnings = [r.getMessage() for r in caplog.records]
  assert len(warnings) == 1 and "skipped 4 of 6 rows" in warnings[0]
  assert "line 2 (row index 1): missing answer" in warnings[0]
  assert "line 4 (row index 3): invalid JSON" in warnings[0]


def test_on_bad_row_error_names_the_row_and_field(jsonl_file):
  with pytest.raises(DatasetError, match=r"set\.jsonl: line 2 \(row index 1\): missing answer"):
    read_dataset(jsonl_file, on_bad_row="error")
  with pytest.raises(ValueError, match="on_bad_row"):
    read_dataset(jsonl_file, on_bad_row="ignore")


def test_all_bad_rows_raise_with_path_count_and_reasons(tmp_path):
  path = _write_jsonl(
    tmp_path / "bad.jsonl",
    [json.dumps({"question": "q"}), "not json", json.dumps({"ref_answer": "1"})],
  )
  with pytest.raises(DatasetError) as e:
    read_dataset(path)
  msg = str(e.value)
  assert path in msg and "no valid row among 3 rows" in msg
  assert "line 1 (row index 0): missing answer" in msg
  assert "line 2 (row index 1): invalid JSON" in msg
  assert "line 3 (row index 2): missing problem" in msg


def test_non_finite_answers_and_bytes_that_are_not_utf8_are_bad_rows(tmp_path, caplog):
  from rlvr.data import datasets

  lines = [
    b'{"problem": "p0", "answer": "4"}',
    b'{"problem": "p1", "answer": NaN}',
    b'{"problem": "p2", "answer": "Infinity"}',
    b'{"problem": "p3", "answer": 1e400}',
    b'{"problem": "p4 \xff", "answer": "5"}',
    b'{"problem": "p5", "answer": " -inf "}',
    b'{"problem": "caf\xc3\xa9 p6", "answer": 2.5}',
  ]
  path = tmp_path / "bad_bytes.jsonl"
  path.write_bytes(b"\n".join(lines) + b"\n")
  with caplog.at_level(logging.WARNING, logger="rlvr.data.readers"):
    ds = read_dataset(str(path))
  assert [(e.problem, e.answer, e.index) for e in ds] == [("p0", "4", 0), ("café p6", "2.5", 6)]
  assert ds.bad_rows == (
    (1, "answer is not a finite number (nan)"),
    (2, "answer is not a finite number ('Infinity')"),
    (3, "answer is not a finite number (inf)"),
    (4, "not valid UTF-8 (byte 0xff at column 17)"),
    (5, "answer is not a finite number (' -inf ')"),
  )
  (warning,) = [r.getMessage() for r in caplog.records]
  assert "skipped 5 of 7 rows" in warning
  assert "line 5 (row index 4): not valid UTF-8 (byte 0xff at column 17)" in warning

  with pytest.raises(DatasetError, match=r"bad_bytes\.jsonl: line 2 \(row index 1\): answer is"):
    read_dataset(str(path), on_bad_row="error")
  path.write_bytes(b"\n".join(lines[:1] + lines[4:5]))
  message = rf"{path}: line 2 \(row index 1\): not valid UTF-8 \(byte 0xff at column 17\)"
  with pytest.raises(DatasetError, match=message):
    read_dataset(str(path), on_bad_row="error")
  with pytest.raises(DatasetError, match=message):  # the run's data settings reach the reader
    datasets.prepare(datasets.DataConfig(train_path=str(path), on_bad_row="error"), 0)


def test_json_array_and_parquet_rows_with_bad_bytes_or_non_finite_answers(tmp_path):
  path = tmp_path / "set.json"
  path.write_bytes(
    b'[\n  {"problem": "p0", "answer": "1"},\n  {"problem": "p\xff1", "answer": "2"},\n'
    b'  {"problem": "p2", "answer": -Infinity},\n  {"problem": "p3", "answer": "3"}\n]\n'
  )
  ds = read_dataset(str(path))
  assert [(e.problem, e.index) for e in ds] == [("p0", 0), ("p3", 3)]
  assert ds.bad_rows == (
    (1, "not valid UTF-8 (byte 0xff at line 3, column 17)"),
    (2, "answer is not a finite number (-inf)"),
  )
  with pytest.raises(
    DatasetError, match=r"set\.json: row index 1: not valid UTF-8 \(byte 0xff at line 3"
  ):
    read_dataset(str(path), on_bad_row="error")
  path.write_bytes(b'[{"problem": "p0", "answer": "1"},\n \xff]')  # outside any string
  with pytest.raises(DatasetError, match=r"line 2, column 2: not valid UTF-8 \(byte 0xff\)"):
    read_dataset(str(path))

  # A parquet string column written without UTF-8 validation (arrow's view of the bytes).
  problems = pa.array([b"p0", b"p\xff1", b"p2", b"p3"], type=pa.binary()).view(pa.string())
  table = pa.table({"problem": problems, "answer": ["1", "2", "NaN", "1e400"]})
  pq.write_table(table, tmp_path / "set.parquet")
  ds = read_dataset(str(tmp_path / "set.parquet"))
  assert [(e.problem, e.answer, e.index) for e in ds] == [("p0", "1", 0)]
  assert ds.bad_rows == (
    (1, "not valid UTF-8 (byte 0xff in column 'problem')"),
    (2, "answer is not a finite number ('NaN')"),
    (3, "answer is not a finite number ('1e400')"),
  )
  with pytest.raises(DatasetError, match=r"set\.parquet: row index 1: not valid UTF-8"):
    read_dataset(str(tmp_path / "set.parquet"), on_bad_row="error")
  floats = pa.table({"problem": ["a", "b", "c"], "answer": [1.0, float("inf"), float("nan")]})
  pq.write_table(floats, tmp_path / "floats.parquet")
  ds = read_dataset(str(tmp_path / "floats.parquet"))
  assert [e.answer for e in ds] == ["1"] and [i for i, _ in ds.bad_rows] == [1, 2]


def test_json_array_with_custom_dotted_fields_and_limit(tmp_path):
  rows = [{"meta": {"text": f"Problem {i}"}, "label": {"value": i}} for i in range(5)]
  rows.insert(2, {"meta": {"text": "no label"}})
  rows.insert(3, "a string, not an object")
  path = tmp_path / "set.json"
  path.write_text(json.dumps(rows), encoding="utf-8")
  ds = read_dataset(str(path), problem_field="meta.text", answer_field="label.value")
  assert [(e.problem, e.answer) for e in ds] == [(f"Problem {i}", str(i)) for i in range(5)]
  assert [i for i, _ in ds.bad_rows] == [2, 3]
  assert "label.value" in ds.bad_rows[0][1] and "not an object" in ds.bad_rows[1][1]
  assert (
    len(read_dataset(str(path), problem_field="meta.text", answer_field="label.value", limit=2))
    == 2
  )
  path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
  with pytest.raises(DatasetError, match="JSON array"):
    read_dataset(str(path))


def test_verl_parquet_and_flat_parquet(tmp_path):
  def verl(content, gt, role="user"):
    return {
      "data_source": "toy",
      "prompt": [{"role": "system", "content": "Be brief."}, {"role": role, "content": content}],
      "reward_model": {"ground_truth": gt, "style": "rule"},
      "extra_info": {"answer": "", "index": 0, "split": "train"},
    }

  rows = [
    verl("Find x.", "3"),
    verl("No user turn", "1", role="assistant"),
    verl("", "2"),
    verl("Find y.", ""),
  ]
  path = str(tmp_path / "verl.parquet")
  pq.write_table(pa.Table.from_pylist(rows), path)
  ds = read_dataset(path)
  assert [(e.problem, e.answer, e.source, e.index, e.solution) for e in ds] == [
    ("Find x.", "3", "toy", 0, None)
  ]
  assert [i for i, _ in ds.bad_rows] == [1, 2, 3]
  assert "user turn" in ds.bad_rows[0][1] and ds.bad_rows[1][1] == "empty problem"
  assert ds.bad_rows[2][1] == "empty answer"

  flat = str(tmp_path / "flat.parquet")
  pq.write_table(pa.Table.from_pylist([{"problem": "p", "answer": 7, "solution": "s"}]), flat)
  (e,) = read_dataset(flat)
  assert (e.problem, e.answer, e.solution) == ("p", "7", "s")


def test_unsupported_extension(tmp_path):
  path = tmp_path / "set.csv"
  path.write_text("problem,answer\n", encoding="utf-8")
  with pytest.raises(DatasetError, match="unsupported extension '.csv'"):
    read_dataset(str(path))


# ------------------------------------------------------------- real public sets
def test_dapo_math_17k():
  ds = read_dataset(os.path.join(TEST_DATA, "dapo_math_17k_first500.parquet"))
  assert len(ds) == 500 and not ds.bad_rows
  assert all(e.answer.lstrip("-").isdigit() for e in ds)
  assert all(e.source == "DAPO-17k" and e.solution is None for e in ds)
  assert [e.index for e in ds[:3]] == [0, 1, 2]
  assert ds[0].problem.startswith("In triangle $ABC$") and ds[0].answer == "34"


def test_eval_sets_agree_between_jsonl_and_parquet():
  js = read_dataset(os.path.join(DATA_DIR, "math_aime_eval.jsonl"))
  pq_ = read_dataset(os.path.join(TEST_DATA, "math_aime_eval.parquet"))
  assert len(js) == len(pq_) == 560 and not js.bad_rows and not pq_.bad_rows
  assert [(e.problem, e.answer, e.source) for e in js] == [
    (e.problem, e.answer, e.source) for e in pq_
  ]
  counts = {s: sum(e.source == s for e in js) for s in {e.source for e in js}}
  assert counts == {"MATH-500": 500, "AIME-2024-30": 30, "AIME-2025-30": 30}
  # Reference solutions live in the parquet's extra_info.answer (none for AIME 2025);
  # the jsonl has none.
  assert all(e.solution and "\\boxed" in e.solution for e in pq_ if e.source == "MATH-500")
  assert all(e.solution is None for e in pq_ if e.source == "AIME-2025-30")
  assert all(e.solution is None for e in js)


# ------------------------------------------------------------- prompts
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from rlvr.model import train_tokenizer

  return train_tokenizer(str(tmp_path_factory.mktemp("tok")))


def test_format_prompt_ends_with_generation_header(tokenizer):
  ids = prompts.format_prompt(tokenizer, "Compute 12+7*3.")
  assert isinstance(ids, list) and all(type(t) is int for t in ids)
  text = tokenizer.decode(ids)
  assert text.endswith("<|im_start|>assistant\n")
  assert text.startswith("<|im_start|>user\nCompute 12+7*3.\n\n")
  assert prompts.DEFAULT_INSTRUCTION in text and "\\boxed{" in prompts.DEFAULT_INSTRUCTION
  bare = tokenizer.decode(prompts.format_prompt(tokenizer, "Compute 12+7*3.", instruction=""))
  assert bare == "<|im_start|>user\nCompute 12+7*3.<|im_end|>\n<|im_start|>assistant\n"


# ------------------------------------------------------------- order
def test_stream_epochs_are_permutations_and_cross_seamlessly():
  s = DataStream(7, seed=3)
  drawn = s.next_indices(5) + s.next_indices(0) + s.next_indices(16)
  assert s.position == 21
  for e in range(3):
    assert sorted(drawn[7 * e : 7 * e + 7]) == list(range(7))
  assert drawn[:7] != drawn[7:14]  # a new permutation each epoch


def test_stream_restores_exact_order_across_epoch_boundary():
  ref = DataStream(10, seed=1).next_indices(40)
  s = DataStream(10, seed=1)
  s.next_indices(8)
  state = s.state()
  assert state == {"n": 10, "seed": 1, "position": 8}
  restored = DataStream.from_state(json.loads(json.dumps(state)))
  assert restored.next_indices(32) == ref[8:]
  assert DataStream(10, seed=1, position=13).next_indices(3) == ref[13:16]
  assert s.next_indices(32) == ref[8:]


def test_stream_seeds_differ_and_do_not_replay_each_other():
  a, b = DataStream(50, seed=0), DataStream(50, seed=1)
  ea, eb = a.next_indices(100), b.next_indices(100)
  assert ea[:50] != eb[:50]
  assert ea[50:] != eb[:50]  # seed + epoch would make these equal
  np.testing.assert_array_equal(a.epoch_permutation(0), ea[:50])


def test_stream_validation():
  with pytest.raises(ValueError, match="n must be"):
    DataStream(0, seed=0)
  with pytest.raises(ValueError, match="missing keys"):
    DataStream.from_state({"n": 3, "seed": 0})


def test_settings_the_data_kind_ignores_are_errors_naming_both_fields():
  from configs import base, tiny_rlvr
  from rlvr.data import datasets

  c = tiny_rlvr.get_config()
  c.data.train_path = "/tmp/nope.jsonl"
  with pytest.raises(ValueError, match=r"data.train_path: set, but data.kind is 'arithmetic'"):
    datasets.prepare(c.data, 0)
  c = base.get_config()
  c.data.arithmetic.n_train = 10
  with pytest.raises(ValueError, match=r"data.arithmetic.n_train: set, but data.kind is 'files'"):
    datasets.prepare(c.data, 0)


def test_a_missing_data_file_stops_the_run_with_one_line_naming_the_field(tmp_path):
  """A bad setting ends launch.train with one line naming the field (exit 1), not a
  traceback; --verbose keeps the traceback."""
  flags = [
    "--config.data.kind=files",
    "--config.sft.steps=0",
    "--config.data.train_path=/nonexistent/train.jsonl",
    "--config.data.arithmetic.n_sft=0",
    "--config.data.arithmetic.n_train=0",
    "--config.data.arithmetic.n_heldout=0",
  ]
  out = tiny_run.launch(tmp_path, *flags, timeout=300)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
    "launch.train: data.train_path: no such file /nonexistent/train.jsonl "
    "(--verbose for the traceback)"
  ], out.stderr
  out = tiny_run.launch(tmp_path, *flags, "--verbose", timeout=300)
  assert out.returncode != 0 and "Traceback" in out.stderr
