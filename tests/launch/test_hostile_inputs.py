"""Hostile inputs through launch.train: data rows that cannot be read as text are named bad
rows, and an SFT model whose bytes changed is named and trained again, never reused."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import tiny_run

from rlvr.data.tasks import arithmetic
from rlvr.run import checkpoint_integrity

DEEP = "[" * 5000 + "]" * 5000
# Hostile rows of the training file, by 0-based line, and how the run names each.
HOSTILE = {
  1: ('{"problem": "1+1", "answer": ' + DEEP + "}", "nested too deep to read"),
  3: ('{"problem": "1+2", "answer": ' + "1" * 5000 + "}", "a number with too many digits"),
  5: ('{"problem": "\\ud800 1+3", "answer": "4"}', "problem holds a lone surrogate (\\ud800)"),
}
# The smallest run of configs/tiny_rlvr.py with an SFT phase: 2 SFT steps, no RL, one sample of 8 tokens per problem.
FLAGS = [
  "--config.data.kind=files",
  "--config.data.arithmetic.n_sft=0",
  "--config.data.arithmetic.n_train=0",
  "--config.data.arithmetic.n_heldout=0",
  "--config.data.chat_template=none",
  "--config.sft.steps=2",
  "--config.sft.batch_size=4",
  "--config.rl.steps=0",
  "--config.eval.sampling.n=1",
  "--config.eval.sampling.max_tokens=8",
  "--config.export_hf=False",
]


def _write_data(data_dir) -> tuple[str, str]:
  """A JSONL training (and SFT) file and a JSON array eval file, each with hostile rows."""
  train, held = arithmetic.make_splits(8, 2, 1, 0, max_operand=9)
  lines = [
    json.dumps({"problem": p.problem, "answer": p.answer, "solution": p.solution}) for p in train
  ]
  for i, (text, _) in sorted(HOSTILE.items()):
    lines.insert(i, text)
  train_path = os.path.join(data_dir, "train.jsonl")
  with open(train_path, "w") as f:
    f.write("\n".join(lines) + "\n")
  elements = [json.dumps({"problem": p.problem, "answer": p.answer}) for p in held]
  eval_path = os.path.join(data_dir, "heldout.json")
  with open(eval_path, "w") as f:
    f.write(
      "["
      + ",\n".join([elements[0], '{"problem": "2+2", "answer": ' + DEEP + "}", *elements[1:]])
      + "]"
    )
  return train_path, eval_path


def _launch(workdir, train_path, eval_path, *more, returncode=0):
  flags = [
    f"--config.data.train_path={train_path}",
    f"--config.data.sft_path={train_path}",
    f"--config.data.eval_paths={eval_path}",
    *more,
  ]
  out = tiny_run.launch(workdir, *FLAGS, *flags, timeout=900)
  assert out.returncode == returncode, out.stderr[-3000:]
  return out


def _blake2b(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.blake2b(f.read()).hexdigest()


def _overwrite_middle(path: str) -> None:
  """4 KiB overwritten in the middle of the file; same size."""
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 2 - 2048)
    f.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  assert os.path.getsize(path) == size


@pytest.mark.slow
def test_hostile_rows_are_named_and_a_corrupt_sft_model_is_trained_again(tmp_path):
  train_path, eval_path = _write_data(str(tmp_path))
  workdir = str(tmp_path / "run")
  first = _launch(workdir, train_path, eval_path)
  for i, (_, why) in HOSTILE.items():
    assert f"line {i + 1} (row index {i}): {why}" in first.stderr, first.stderr[-3000:]
  assert "skipped 1 of 3 rows (row index 1: nested too deep to read" in first.stderr

  model = os.path.join(workdir, "sft", "model")
  weights = os.path.join(model, "model.safetensors")
  trained = _blake2b(weights)
  _overwrite_middle(weights)
  again = _launch(workdir, train_path, eval_path)
  aside = os.path.join(workdir, "sft", "corrupt", "model-checksum")
  assert (
    f"SFT: {model} does not verify: model.safetensors: contents differ from the manifest "
    f"(BLAKE2b checksum); moved to {aside}; training it again"
  ) in again.stderr, again.stdout[-3000:]
  assert "SFT: done before, reusing" not in again.stdout
  # Trained again from the same data and seed: the same weights, and they verify.
  assert checkpoint_integrity.verify(model) is None and _blake2b(weights) == trained
  assert os.path.isdir(aside)

  # Another run starts from this finished SFT (sft.init_from) instead of training its own,
  # and only from one that verifies.
  other = tmp_path / "other"
  reused = _launch(str(other), train_path, eval_path, f"--config.sft.init_from={workdir}")
  assert f"SFT: reusing {model} (sft.init_from)" in reused.stdout
  assert not (other / "sft").exists() and (other / "eval_before_rl").is_dir()
  _overwrite_middle(weights)
  flag = f"--config.sft.init_from={workdir}"
  bad = _launch(str(tmp_path / "third"), train_path, eval_path, flag, returncode=1)
  assert bad.stderr.strip().splitlines()[-1] == (
    f"launch.train: sft.init_from: {model} does not verify: model.safetensors: contents "
    "differ from the manifest (BLAKE2b checksum) (--verbose for the traceback)"
  )


def test_a_parquet_schema_nested_too_deep_stops_the_run_with_one_line_naming_the_file(tmp_path):
  """Parquet nests by schema, the same for every row: a schema deeper than parquet reads
  is the file's fault, one line naming it (exit 1), not a traceback."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  answer, kind = 2, pa.int64()
  for _ in range(120):
    answer, kind = [answer], pa.list_(kind)
  path = str(tmp_path / "deep.parquet")
  pq.write_table(pa.table({"problem": ["1+1"], "answer": pa.array([answer], type=kind)}), path)
  out = tiny_run.launch(tmp_path / "run", *FLAGS, f"--config.data.train_path={path}", timeout=300)
  assert out.returncode == 1, out.stderr[-3000:]
  assert out.stderr.strip().splitlines() == [
    f"launch.train: {path}: not a parquet file that can be read (Parquet schema too deeply "
    "nested, consider increasing schema depth limit (current limit is 100)) "
    "(--verbose for the traceback)"
  ], out.stderr[-3000:]
