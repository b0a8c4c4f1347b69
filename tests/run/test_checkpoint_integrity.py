"""Checkpoints verify themselves: real orbax checkpoints of a tiny TrainState, damaged on
disk (bytes overwritten in place, a data file truncated, orbax's JSON metadata truncated,
the manifest missing), are set aside with one line each and the state resumes from the
newest step that verifies, equal to what that step saved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import checkpoint_worker as worker
import jax
import numpy as np
import pytest
import tiny_run
from paths import REPO

from rlvr.model import decoder
from rlvr.parallel import sharding
from rlvr.run import checkpoint, checkpoint_integrity

MODEL = worker.MODEL
LEARNER = worker.learner_config()
_state_at = worker.state_at


def _no_params():
  raise AssertionError("a resumed run does not load fresh parameters")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """(checkpoint dir with steps 1 and 2, {step: saved state}, mesh), written once."""
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  base = worker.base_state(mesh)
  directory = str(tmp_path_factory.mktemp("ck") / "checkpoints")
  mngr = checkpoint.manager(directory)
  states = {s: _state_at(base, s) for s in (1, 2)}
  for s, state in states.items():
    checkpoint.save(mngr, state, {"step": s, "data": {"position": 10 * s}})
  mngr.close()
  return directory, jax.device_get(states), mesh


@pytest.fixture
def ckdir(saved, tmp_path):
  directory, _, _ = saved
  copy = str(tmp_path / "checkpoints")
  shutil.copytree(directory, copy)
  return copy


def _resume(saved, directory, load_params=_no_params):
  _, _, mesh = saved
  mngr, state, meta = checkpoint.restore_or_init(directory, MODEL, LEARNER, mesh, load_params)
  return mngr, state, meta


def _assert_state_equal(a, b):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


def _largest_data_file(step_dir: str) -> str:
  """The largest of the state's data files (those in a `d/` directory)."""
  files = [
    os.path.join(root, n)
    for root, _, names in os.walk(os.path.join(step_dir, "state"))
    if os.path.basename(root) == "d"
    for n in names
  ]
  return max(files, key=os.path.getsize)


def _overwrite_middle(path: str) -> None:
  """4 KiB (or a quarter of a smaller file) overwritten in the middle; same size."""
  size = os.path.getsize(path)
  n = min(4096, size // 4)
  with open(path, "r+b") as f:
    f.seek(size // 2 - n // 2)
    f.write(np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes())
  assert os.path.getsize(path) == size


def _truncate(path: str, keep: int | None = None) -> None:
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2 if keep is None else keep)


DAMAGE = {
  "bytes_overwritten": (lambda d: _overwrite_middle(_largest_data_file(d)), "checksum"),
  "data_truncated": (lambda d: _truncate(_largest_data_file(d)), "truncated"),
  "orbax_metadata_truncated": (
    lambda d: _truncate(os.path.join(d, "state", "_METADATA"), 100),
    "truncated",
  ),
  "json_meta_truncated": (
    lambda d: _truncate(os.path.join(d, "meta", "metadata"), 20),
    "truncated",
  ),
  "manifest_missing": (
    lambda d: os.remove(os.path.join(d, checkpoint_integrity.MANIFEST)),
    "unverified",
  ),
  "manifest_garbled": (
    lambda d: _truncate(os.path.join(d, checkpoint_integrity.MANIFEST), 30),
    "manifest",
  ),
}


def test_manifest_lists_every_file_of_the_step(saved):
  directory, _, _ = saved
  step_dir = os.path.join(directory, "2")
  with open(os.path.join(step_dir, checkpoint_integrity.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest["format"] == 1 and manifest["hash"] == "blake2b-256"
  on_disk = sorted(
    os.path.relpath(os.path.join(root, n), step_dir)
    for root, _, names in os.walk(step_dir)
    for n in names
    if n != checkpoint_integrity.MANIFEST
  )
  assert sorted(manifest["files"]) == on_disk
  assert "state/_METADATA" in on_disk and "meta/metadata" in on_disk
  for rel, entry in manifest["files"].items():
    assert entry["bytes"] == os.path.getsize(os.path.join(step_dir, rel))
  assert checkpoint_integrity.verify(step_dir) is None


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_latest_step_falls_back_to_the_previous_one(saved, ckdir, damage, capsys):
  _, states, _ = saved
  step_dir = os.path.join(ckdir, "2")
  harm, reason = DAMAGE[damage]
  harm(step_dir)
  problem = checkpoint_integrity.verify(step_dir)
  assert problem is not None and problem.reason == reason
  mngr, state, meta = _resume(saved, ckdir)
  assert meta["step"] == 1 and meta["data"] == {"position": 10}
  _assert_state_equal(state, states[1])
  # Set aside, not deleted; orbax no longer lists it.
  aside = os.path.join(ckdir, checkpoint_integrity.CORRUPT, f"2-{reason}")
  assert os.path.isdir(aside) and not os.path.exists(step_dir)
  assert mngr.all_steps() == [1] and checkpoint_integrity.steps(ckdir) == [1]
  mngr.close()
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines == [
    f"checkpoint {step_dir} does not verify: {problem.file}: {problem.detail}; moved to {aside}",
    f"checkpoint: resuming from {os.path.join(ckdir, '1')}, the newest that verifies",
  ]


def test_restore_of_a_damaged_step_names_it_in_one_line(saved, ckdir):
  _, _, mesh = saved
  _truncate(_largest_data_file(os.path.join(ckdir, "2")))
  mngr = checkpoint.manager(ckdir)
  with pytest.raises(checkpoint_integrity.CheckpointError) as e:
    checkpoint.restore(mngr, checkpoint.abstract_state(MODEL, LEARNER, mesh))
  mngr.close()
  text = str(e.value)
  assert text.startswith(f"checkpoint {os.path.join(ckdir, '2')} does not verify: state/")
  assert "(truncated)" in text and "\n" not in text
  assert checkpoint_integrity.steps(ckdir) == [1, 2]  # `restore` itself moves nothing


def test_no_step_verifies_stops_until_the_corrupt_dir_is_moved(saved, ckdir, tmp_path):
  for s in ("1", "2"):
    _overwrite_middle(_largest_data_file(os.path.join(ckdir, s)))
  aside = os.path.join(ckdir, checkpoint_integrity.CORRUPT)
  expected = (
    f"no checkpoint under {ckdir} verifies (set aside in {aside}: 1-checksum, 2-checksum); "
    f"to start this phase from scratch move {aside} out of the work dir, or give a new --workdir"
  )
  with pytest.raises(checkpoint_integrity.CheckpointError) as e:
    _resume(saved, ckdir)
  assert str(e.value) == expected
  # A rerun does not quietly start from scratch either.
  with pytest.raises(checkpoint_integrity.CheckpointError) as e:
    _resume(saved, ckdir)
  assert str(e.value) == expected
  shutil.move(aside, str(tmp_path / "kept"))
  loaded = []
  _, _, mesh = saved

  def params():
    loaded.append(True)
    return decoder.init(MODEL, jax.random.PRNGKey(1))

  mngr, state, meta = _resume(saved, ckdir, params)
  mngr.close()
  assert meta is None and loaded and int(state.step) == 0


# The smallest whole run that updates: no SFT, 8 held-out problems, 2 RL steps of 4
# prompts with a checkpoint after each; the overlong penalty gives an untrained policy's
# groups reward variance, so every step makes an update.
SMALL_RUN = [
  "--config=configs/tiny_rlvr.py",
  "--config.sft.steps=0",
  "--config.data.arithmetic.n_sft=0",
  "--config.data.arithmetic.n_heldout=8",
  "--config.eval.sampling.n=1",
  "--config.rl.steps=2",
  "--config.checkpoint.every=1",
  "--config.rl.loop.prompts_per_step=4",
  "--config.rl.loop.dynamic_sampling=False",
  "--config.shaping.overlong_cache=40",
  "--config.export_hf=False",
]


def _launch(workdir):
  return tiny_run.launch(workdir, *SMALL_RUN, config=None)  # SMALL_RUN names the config


def _train(workdir):
  out = _launch(workdir)
  assert out.returncode == 0, out.stderr[-3000:]
  return out, tiny_run.rows(os.path.join(workdir, "metrics.jsonl"), timing=True)


@pytest.mark.slow
def test_launch_train_resumes_from_the_previous_checkpoint_when_the_latest_is_damaged(tmp_path):
  workdir = str(tmp_path / "run")
  _, first = _train(workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  assert checkpoint_integrity.steps(checkpoints) == [1, 2]
  _overwrite_middle(_largest_data_file(os.path.join(checkpoints, "2")))
  out, again = _train(workdir)
  step_dir, aside = (
    os.path.join(checkpoints, "2"),
    os.path.join(checkpoints, "corrupt", "2-checksum"),
  )
  assert f"checkpoint {step_dir} does not verify: state/" in out.stderr
  assert f"contents differ from the manifest (BLAKE2b checksum); moved to {aside}" in out.stderr
  assert "resumed rlvr from step 1" in out.stdout
  # Step 2 made again from step 1's state: the same numbers as the first time.
  assert [r["step"] for r in again] == [0, 1] and again[0] == first[0]
  for k, v in first[1].items():
    if not k.startswith(tiny_run.TIMING):
      assert again[1][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
  assert checkpoint_integrity.steps(checkpoints) == [1, 2] and os.path.isdir(aside)
  assert checkpoint_integrity.verify(step_dir) is None


@pytest.mark.slow
def test_launch_train_whose_disk_fills_at_a_checkpoint_stops_in_one_line(tmp_path):
  from mounts import tmpfs

  # 1 MiB holds the run's reports and metrics, not the first checkpoint (~9 MB).
  with tmpfs(str(tmp_path / "full"), "1m") as workdir:
    out = _launch(workdir)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    checkpoints = os.path.join(workdir, "checkpoints")
    assert line.startswith(f"launch.train: cannot write {checkpoints}/1.orbax-checkpoint-tmp/")
    assert line.endswith(
      ": no space left on the device (ENOSPC); free space on that file system, or give "
      "another --workdir (--verbose for the traceback)"
    )
    assert os.listdir(checkpoints) == []  # the partial step is gone
    assert os.path.exists(os.path.join(workdir, "eval_before_rl", "eval.json"))


def test_asyncio_says_nothing_of_a_failed_saves_abandoned_writes_and_all_else_it_did():
  """After a failed save, asyncio reports each write task orbax abandoned when the task is
  collected, which may be long after the save's own error was raised and reported."""
  import logging

  def record(message):
    return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1, message, None, None)

  abandoned = (
    "_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished "
    'exception=ValueError(\'RESOURCE_EXHAUSTED: Error writing "opt_state.1.count/0" in OCDBT '
    'database at local file "/w/checkpoints/1.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/"'
    ": No space left on device [os_error_code='28']')>"
  )
  assert not checkpoint._ABANDONED.filter(record(abandoned))
  assert checkpoint._ABANDONED.filter(record("Task exception was never retrieved\nfuture: x"))


@pytest.mark.slow
def test_two_processes_write_one_manifest_and_resume_past_a_damaged_step(tmp_path):
  """Process 0 writes the manifest once both processes finished writing (their data
  files included), checks and sets aside on resume; both resume from the same step."""
  from rlvr.sampling.vllm_server import free_port

  directory = str(tmp_path / "checkpoints")

  def run(phase):
    port, script = free_port(), os.path.join(REPO, "tests", "checkpoint_worker.py")
    procs = [
      subprocess.Popen(
        [sys.executable, script, phase, directory, f"--process_id={i}", f"--port={port}"],
        cwd=REPO,
        env=tiny_run.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
      for i in (0, 1)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outputs)]

  assert [r[0] for r in run("save")] == [0, 0]
  with open(os.path.join(directory, "2", checkpoint_integrity.MANIFEST)) as f:
    files = json.load(f)["files"]
  assert any(f.startswith("state/ocdbt.process_1/") for f in files)
  _overwrite_middle(_largest_data_file(os.path.join(directory, "2")))
  (code0, out0, err0), (code1, out1, err1) = run("resume")
  assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
  assert (
    out0.strip().splitlines()[-1] == out1.strip().splitlines()[-1] == "resumed step 1 equal True"
  )
  assert f"checkpoint {os.path.join(directory, '2')} does not verify: state/" in err0
  assert "does not verify" not in err1  # process 0 alone checks, moves and says so
  _overwrite_middle(_largest_data_file(os.path.join(directory, "1")))
  (code0, out0, _), (code1, out1, _) = run("resume")
  assert (code0, code1) == (3, 3)
  last0, last1 = out0.strip().splitlines()[-1], out1.strip().splitlines()[-1]
  assert last0.startswith(f"error: no checkpoint under {directory} verifies (set aside in ")
  assert last1 == (
    f"error: no checkpoint under {directory} verifies (process 0 says which and why)"
  )
