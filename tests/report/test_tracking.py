"""wandb beside metrics.jsonl and TensorBoard: the real wandb package in offline mode, its
run files read back; a rerun in the same work dir continues the same wandb run, and
TensorBoard shows each step once."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import sys

import pytest
import run_output
import tiny_run

from rlvr.report import metrics
from rlvr.run import experiment, sections


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """wandb in offline mode, its files under tmp_path/wandb_home, quiet."""
  home = tmp_path / "wandb_home"
  home.mkdir()
  for k, v in {
    "WANDB_MODE": "offline",
    "WANDB_DIR": str(home),
    "WANDB_SILENT": "true",
    "WANDB_CONFIG_DIR": str(home / "config"),
    "WANDB_CACHE_DIR": str(home / "cache"),
    "WANDB_DATA_DIR": str(home / "data"),
  }.items():
    monkeypatch.setenv(k, v)
  return home


def _records(path: str):
  """The records of a `.wandb` run file: a 7-byte header (":W&B", 0xBEE1, version), then
  blocks of 32 KiB holding records of (crc32, length, kind) + a protobuf `Record`; a record
  longer than a block's rest is split into first / middle / last pieces."""
  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B", path
  block, pos, piece = 32768, 7, b""
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a header is padding
      pos += left
      continue
    _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if n == 0 and kind == 0:
      pos += left
      continue
    piece += data[pos + 7 : pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):  # full, last
      record = wandb_internal_pb2.Record()
      record.ParseFromString(piece)
      piece = b""
      yield record


def _read_run(path: str) -> dict:
  """{id, name, project, tags, config, history}: what the run file says."""
  out = {"history": []}
  for r in _records(path):
    kind = r.WhichOneof("record_type")
    if kind == "run":
      out.update(
        id=r.run.run_id,
        name=r.run.display_name,
        project=r.run.project,
        tags=list(r.run.tags),
        config={u.key: json.loads(u.value_json) for u in r.run.config.update},
      )
    elif kind == "history":
      out["history"].append(
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
      )
  return out


def _close(writer) -> None:
  """Closes the writer, then stops wandb's service process, which writes the run files out
  when it stops (`finish` returns before they reach the disk)."""
  import wandb

  writer.close()
  wandb.teardown()


def _run_files(home) -> list[str]:
  return sorted(glob.glob(os.path.join(home, "wandb", "offline-run-*", "run-*.wandb")))


def test_metrics_go_to_wandb_and_a_resumed_run_continues_it(tmp_path, offline):
  workdir = str(tmp_path / "run")
  cfg = sections.LoggingConfig(wandb=True, wandb_project="tracking-test", wandb_tags=("grpo",))
  config = {"rl": {"steps": 4}, "seed": 0}
  w = metrics.MetricsWriter(workdir, resume_step=0, logging=cfg, config=config)
  for step in range(3):
    w.write(step, {"reward_mean": 0.25 * step, "entropy": 1.5, "note": "text is not logged"})
  _close(w)
  run_id = open(os.path.join(workdir, metrics.WANDB_RUN_ID)).read().strip()
  (first,) = _run_files(offline)
  run = _read_run(first)
  assert run["id"] == run_id and run["name"] == "run" and run["project"] == "tracking-test"
  assert run["tags"] == ["grpo"]
  assert run["config"]["rl"] == {"steps": 4} and run["config"]["seed"] == 0
  history = [{k: v for k, v in h.items() if not k.startswith("_")} for h in run["history"]]
  assert history == [{"step": s, "reward_mean": 0.25 * s, "entropy": 1.5} for s in range(3)]
  # TensorBoard and metrics.jsonl are written as without wandb.
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))
  assert [r["step"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [
    0,
    1,
    2,
  ]

  # The rerun resumes at step 2 (its last checkpoint): the same wandb run goes on.
  w = metrics.MetricsWriter(workdir, resume_step=2, logging=cfg, config=config)
  for step in (2, 3):
    w.write(step, {"reward_mean": 1.0, "entropy": 1.0})
  _close(w)
  runs = [_read_run(p) for p in _run_files(offline)]
  assert {r["id"] for r in runs} == {run_id}
  steps = sorted(h["step"] for r in runs for h in r["history"])
  assert steps == [0, 1, 2, 2, 3]  # plotted against "step": step 2 logged by both
  assert [r["step"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [
    0,
    1,
    2,
    3,
  ]


def test_processes_other_than_0_and_runs_without_wandb_start_no_wandb_run(tmp_path, offline):
  cfg = sections.LoggingConfig(wandb=True)
  w = metrics.MetricsWriter(str(tmp_path / "other"), logging=cfg, enabled=False)
  w.write(0, {"reward_mean": 1.0})
  w.close()
  w = metrics.MetricsWriter(str(tmp_path / "plain"), logging=sections.LoggingConfig())
  w.write(0, {"reward_mean": 1.0})
  w.close()
  assert _run_files(offline) == []
  assert not os.path.exists(tmp_path / "other")
  assert not os.path.exists(tmp_path / "plain" / metrics.WANDB_RUN_ID)


def _load(*overrides: str):
  return tiny_run.config("tiny_rlvr", *overrides)


def test_logging_section_defaults_and_overrides():
  assert experiment.check(_load()).logging == sections.LoggingConfig()
  assert sections.LoggingConfig().tensorboard and not sections.LoggingConfig().wandb
  checked = experiment.check(
    _load(
      "--config.logging.wandb=True",
      "--config.logging.wandb_project=math",
      "--config.logging.wandb_mode=offline",
      "--config.logging.tensorboard=False",
    )
  )
  assert checked.logging == sections.LoggingConfig(
    tensorboard=False, wandb=True, wandb_project="math", wandb_mode="offline"
  )


def test_a_missing_wandb_package_is_one_line_naming_pip_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  assert metrics.WANDB_MISSING.startswith("logging.wandb: the wandb package is not installed; ")
  assert "pip install wandb" in metrics.WANDB_MISSING
  with pytest.raises(ValueError) as before_the_run:  # checked before anything is built
    experiment.check(_load("--config.logging.wandb=True"))
  with pytest.raises(ValueError) as in_the_writer:
    metrics.import_wandb()
  assert str(before_the_run.value) == str(in_the_writer.value) == metrics.WANDB_MISSING
  experiment.check(_load("--config.logging.wandb=True", "--config.logging.wandb_mode=disabled"))


def test_launch_takes_tags_and_names_a_bad_mode_in_one_line(tmp_path):
  out = tiny_run.launch(
    tmp_path / "run",
    "--config.logging.wandb=True",
    "--config.logging.wandb_tags=grpo,tiny",
    "--config.logging.wandb_mode=online-please",
    timeout=300,
  )
  assert out.returncode == 1
  (line,) = out.stderr.strip().splitlines()
  assert line.startswith("launch.train: logging.wandb_mode: unknown 'online-please'"), line


def test_tensorboard_shows_each_step_once_after_a_resume_and_no_nan(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  logdir = os.path.join(workdir, "tensorboard")
  w = metrics.MetricsWriter(workdir, resume_step=0)
  for step in range(3):
    w.write(step, {"reward_mean": 0.25 * step, "kl": float("nan") if step == 1 else 0.1})
  w.close()
  # The rerun resumes at step 2 (its last checkpoint) and logs step 2 again, then step 3.
  w = metrics.MetricsWriter(workdir, resume_step=2)
  for step in (2, 3):
    w.write(step, {"reward_mean": 1.0, "kl": float("inf") if step == 3 else 0.2})
  w.close()
  scalars = run_output.tensorboard_scalars(logdir)
  assert scalars["reward_mean"] == [(0, 0.0), (1, 0.25), (2, 1.0), (3, 1.0)]
  assert scalars["kl"] == [(0, 0.1), (2, 0.2)]  # NaN / inf left out of TensorBoard ...
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  assert math.isnan(rows[1]["kl"]) and rows[3]["kl"] == float("inf")  # ... kept in the jsonl
  assert "NaN or Inf" not in caplog.text  # tensorboardX's warning, printed into the bar
  # A rerun from step 0 (no checkpoint yet) starts TensorBoard afresh.
  metrics.MetricsWriter(workdir, resume_step=0).close()
  assert run_output.tensorboard_scalars(logdir) == {} and len(os.listdir(logdir)) == 1
