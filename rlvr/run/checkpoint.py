"""Orbax checkpoints of the TrainState plus JSON metadata; HF export of the policy.

Restoring takes an abstract state whose leaves carry the target shardings, so
a run can resume on a different mesh (orbax reshards on read).

Every checkpoint verifies itself: once orbax has finished writing a step (on every
process), process 0 writes `rlvr_manifest.json` into the step's directory, the size and
BLAKE2b checksum of each of its files, atomically. A step is restored only if its
manifest lists every file in the step's directory, each inside it and there with that
size and checksum; a step without a manifest (a save that did not finish) does not
verify either. The SFT phase's HF export carries the same manifest (`export_hf`).
`restore_or_init` moves a step that does not verify to `<dir>/corrupt/<step>-<reason>`
(orbax no longer lists it), says so in one line and resumes from the newest step that
verifies; with none left, the run stops with one line saying what to move.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import time
import traceback
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from rlvr import learner
from rlvr.common import fileio
from rlvr.model import decoder, hf_io, peft_io
from rlvr.model.config import ModelConfig
from rlvr.parallel import distributed

MANIFEST = "rlvr_manifest.json"
CORRUPT = "corrupt"  # where steps that do not verify are moved, under the checkpoint dir
_CHUNK = 1 << 20


class CheckpointError(ValueError):
  """A checkpoint that does not verify, or a checkpoint dir none of whose steps does:
  the message is one line naming the step dir, the file and why."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """Why a step does not verify: `file` (relative to the step dir) and a one-word
  `reason` (unverified, manifest, unlisted, missing, truncated, size, checksum), `detail`
  in words."""

  file: str
  reason: str
  detail: str


def _digest(path: str) -> tuple[int, str]:
  """(bytes, BLAKE2b-256 hex) of a file, read in 1 MiB chunks."""
  h, n = hashlib.blake2b(digest_size=32), 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
      n += len(chunk)
  return n, h.hexdigest()


def _digests(root: str, files: list[str]) -> list[tuple[int, str]]:
  # hashlib releases the GIL on large updates: a few threads read and hash in parallel.
  with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(lambda rel: _digest(os.path.join(root, rel)), files))


def _files(step_dir: str) -> list[str]:
  """Every file under the step dir (relative, sorted) but the manifest and its temporary;
  a link to a folder (which the walk does not enter) counts as a file."""
  out = []
  for root, dirs, names in os.walk(step_dir):
    dirs.sort()
    links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
    for name in sorted(names + links):
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if not rel.startswith(MANIFEST):
        out.append(rel)
  return out


def _inside(root: str, rel: str) -> bool:
  """Whether `rel` names a path under the folder `root`, links resolved."""
  if not rel or os.path.isabs(rel):
    return False
  real = os.path.realpath(root)
  return os.path.realpath(os.path.join(real, rel)).startswith(real + os.sep)


def write_manifest(step_dir: str) -> str:
  """Writes `step_dir`/rlvr_manifest.json: {"format": 1, "hash": "blake2b-256",
  "files": {relative path: {"bytes": n, "blake2b": hex}}} of every file there."""
  files = _files(step_dir)
  sums = _digests(step_dir, files)
  body = {
    "format": 1,
    "hash": "blake2b-256",
    "files": {rel: {"bytes": n, "blake2b": h} for rel, (n, h) in zip(files, sums)},
  }
  path = os.path.join(step_dir, MANIFEST)
  with fileio.atomic_open(path, fsync=True) as f:
    json.dump(body, f, indent=1)
  return path


def verify(step_dir: str) -> Problem | None:
  """None when the step's manifest lists every file in `step_dir`, each entry a path inside
  it (links resolved), and each file is there with its size and checksum; else the first
  problem: no manifest, an unreadable or empty one, an entry outside the folder (never
  read), an unlisted file, then sizes before any file is read, then checksums."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    return Problem(
      MANIFEST,
      "unverified",
      "no manifest (its save did not finish, or an rlvr without checksums wrote it)",
    )
  try:
    with open(path) as f:
      files = json.load(f)["files"]
    expected = [(rel, int(e["bytes"]), str(e["blake2b"])) for rel, e in files.items()]
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return Problem(MANIFEST, "manifest", f"unreadable manifest ({' '.join(str(e).split())})")
  if not expected:
    return Problem(MANIFEST, "manifest", "the manifest lists no files")
  for rel, _, _ in expected:
    if not _inside(step_dir, rel):
      why = "outside the folder (a manifest entry must name a file inside it)"
      return Problem(rel, "manifest", why)
  listed = {os.path.normpath(rel) for rel, _, _ in expected}
  for rel in _files(step_dir):
    if rel not in listed:
      why = "not in the manifest (every file of the folder must be listed)"
      return Problem(rel, "unlisted", why)
  for rel, size, _ in expected:
    full = os.path.join(step_dir, rel)
    if not os.path.isfile(full):
      return Problem(rel, "missing", "missing")
    have = os.path.getsize(full)
    if have != size:
      why = "truncated" if have < size else "size"
      return Problem(rel, why, f"{have} bytes, the manifest says {size} ({why})")
  sums = _digests(step_dir, [rel for rel, _, _ in expected])
  for (rel, _, want), (_, got) in zip(expected, sums):
    if got != want:
      return Problem(rel, "checksum", "contents differ from the manifest (BLAKE2b checksum)")
  return None


def steps(directory: str) -> list[int]:
  """The steps under a checkpoint dir, as orbax names them (an integer directory)."""
  if not os.path.isdir(directory):
    return []
  return sorted(
    int(n)
    for n in os.listdir(directory)
    if n.isdigit() and os.path.isdir(os.path.join(directory, n))
  )


def move_aside(directory: str, name: int | str, problem: Problem) -> str:
  """`directory`/<name> (a step, or the SFT phase's `model`) ->
  `directory`/corrupt/<name>-<reason>[-k], with a note of why."""
  aside = os.path.join(directory, CORRUPT)
  os.makedirs(aside, exist_ok=True)
  dest, k = os.path.join(aside, f"{name}-{problem.reason}"), 1
  while os.path.exists(dest):
    k += 1
    dest = os.path.join(aside, f"{name}-{problem.reason}-{k}")
  os.rename(os.path.join(directory, str(name)), dest)
  with open(os.path.join(dest, "rlvr_corrupt.txt"), "w") as f:
    f.write(f"{problem.file}: {problem.detail}\n")
  return dest


def _newest_verified(directory: str) -> int | None:
  """Process 0's part of `latest_verified`."""
  moved = []
  for step in reversed(steps(directory)):
    step_dir = os.path.join(directory, str(step))
    problem = verify(step_dir)
    if problem is None:
      if moved:
        print(
          f"checkpoint: resuming from {step_dir}, the newest that verifies",
          file=sys.stderr,
          flush=True,
        )
      return step
    dest = move_aside(directory, step, problem)
    moved.append(dest)
    print(
      f"checkpoint {step_dir} does not verify: {problem.file}: {problem.detail}; moved to {dest}",
      file=sys.stderr,
      flush=True,
    )
  aside = os.path.join(directory, CORRUPT)
  if moved or (os.path.isdir(aside) and os.listdir(aside)):
    names = ", ".join(sorted(os.listdir(aside)))
    raise CheckpointError(
      f"no checkpoint under {directory} verifies (set aside in {aside}: {names}); to start "
      f"this phase from scratch move {aside} out of the work dir, or give a new --workdir"
    )
  return None


def latest_verified(directory: str) -> int | None:
  """The newest step under `directory` that verifies, None when there is none and none
  was ever set aside. Steps that do not verify are moved to `directory`/corrupt/ with one
  line each on stderr; a dir whose every step was set aside raises `CheckpointError`.

  Process 0 checks and moves; every process gets its answer."""
  if jax.process_count() == 1:
    return _newest_verified(directory)
  from jax.experimental import multihost_utils

  found, error = -1, None
  if distributed.is_writer():
    try:
      step = _newest_verified(directory)
      found = -1 if step is None else step
    except Exception as e:  # noqa: BLE001 - raised below, after the others know
      found, error = -2, e
  found = int(multihost_utils.broadcast_one_to_all(np.int32(found)))
  if error is not None:
    raise error
  if found == -2:
    raise CheckpointError(
      f"no checkpoint under {directory} verifies (process 0 says which and why)"
    )
  return None if found == -1 else found


def manager(directory: str, keep: int = 3) -> ocp.CheckpointManager:
  """CheckpointManager keeping the last `keep` steps under `directory`; it removes the
  temporary dirs of saves that did not finish (a run holds its work dir's lock)."""
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep, create=True, cleanup_tmp_directories=True
  )
  return ocp.CheckpointManager(
    os.path.abspath(directory), options=options, item_names=("state", "meta")
  )


def versions() -> dict[str, str]:
  import flax
  import optax

  import rlvr

  return {
    "rlvr": rlvr.__version__,
    "jax": jax.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
    "orbax": ocp.__version__ if hasattr(ocp, "__version__") else "",
    "python": platform.python_version(),
  }


def save(
  mngr: ocp.CheckpointManager,
  state: learner.TrainState,
  metadata: dict[str, Any] | None = None,
) -> int:
  """Saves `state` with metadata (data position, config, ...) + versions, waits until
  every process has written it, then process 0 writes its manifest (`write_manifest`).

  The checkpoint's step is metadata["step"] when given: the RL loop's position,
  which differs from the optimizer's update count (`state.step`) once a step makes
  several optimizer steps (mini-batches) or none (an empty buffer). Else state.step.
  """
  step = (
    int(metadata["step"]) if metadata and "step" in metadata else int(jax.device_get(state.step))
  )
  meta = dict(metadata or {}, step=step, versions=versions())
  step_dir = os.path.join(str(mngr.directory), str(step))
  existed = os.path.exists(step_dir)
  try:
    with _orbax_errors_raised_not_logged():
      saved = mngr.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
      )
      mngr.wait_until_finished()
    if not saved:
      return step
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f"rlvr checkpoint {step} written")
    if distributed.is_writer():
      write_manifest(step_dir)
  except Exception:
    if distributed.is_writer() and not existed:
      _remove_partial(str(mngr.directory), step)
    raise
  return step


class _DropSaveErrors(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or not (
      f"{os.sep}orbax{os.sep}" in record.pathname or record.name == "asyncio"
    )


class _DropAbandonedOrbaxTasks(logging.Filter):
  """Drops asyncio's "exception was never retrieved" for a task of orbax's: one whose text
  or traceback names orbax's code or a checkpoint's temporary directory."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if f"{os.sep}orbax{os.sep}" in text or ".orbax-checkpoint-tmp" in text:
      return False
    error = record.exc_info[1] if record.exc_info else None
    frames = traceback.walk_tb(error.__traceback__) if error is not None else ()
    return not any(f"{os.sep}orbax{os.sep}" in frame.f_code.co_filename for frame, _ in frames)


_ABANDONED = _DropAbandonedOrbaxTasks()


@contextlib.contextmanager
def _orbax_errors_raised_not_logged():
  """A save that fails (a full disk) raises its error; orbax also logs it with a traceback
  from each of its threads, and asyncio each write task it abandoned (when the task is
  collected, which the raised error's traceback may delay): the raised error alone tells."""
  loggers, drop = (logging.getLogger("absl"), logging.getLogger("asyncio")), _DropSaveErrors()
  for logger in loggers:
    logger.addFilter(drop)
  try:
    yield
  except BaseException:
    # From now on asyncio says nothing of orbax's abandoned tasks (their error is raised).
    logging.getLogger("asyncio").addFilter(_ABANDONED)
    raise
  finally:
    for logger in loggers:
      logger.removeFilter(drop)


def _remove_partial(directory: str, step: int) -> None:
  """What a save that failed (a full disk, ...) left of `step`: nothing half-written stays.
  TensorStore writes the failed save abandoned may still land for a moment: remove until
  nothing of the step has come back for three checks 0.1 s apart (10 s at most)."""

  def left():
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return [n for n in names if n == str(step) or n.startswith(f"{step}.orbax-checkpoint-tmp")]

  quiet = 0
  for _ in range(100):
    names = left()
    quiet = 0 if names else quiet + 1
    if quiet == 3:
      return
    for name in names:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    time.sleep(0.1)


def abstract_state(model_cfg: ModelConfig, cfg: learner.LearnerConfig, mesh, rules=None):
  """TrainState of ShapeDtypeStructs carrying the shardings of `mesh`."""
  shapes = jax.eval_shape(
    functools.partial(learner.new_state, cfg=cfg),
    decoder.param_shapes(model_cfg),
    jax.random.PRNGKey(0),
  )
  shardings = learner.state_shardings(model_cfg, cfg, mesh, rules)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
  )


def restore(mngr: ocp.CheckpointManager, target, step: int | None = None):
  """(state, metadata) of `step` (default: latest) placed as `target` says; a step that
  does not verify raises `CheckpointError` (`restore_or_init` falls back instead)."""
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {mngr.directory}")
  step_dir = os.path.join(str(mngr.directory), str(step))
  problem = verify(step_dir)
  if problem is not None:
    raise CheckpointError(
      f"checkpoint {step_dir} does not verify: {problem.file}: {problem.detail}"
    )
  return _restore(mngr, target, step)


def _restore(mngr: ocp.CheckpointManager, target, step: int):
  out = mngr.restore(
    step,
    args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()),
  )
  return out.state, out.meta


def restore_or_init(
  directory: str,
  model_cfg: ModelConfig,
  cfg: learner.LearnerConfig,
  mesh,
  load_params: Callable[[], Any],
  *,
  seed: int = 0,
  keep: int = 3,
):
  """The learner set-up SFT and RL share: (manager, state, metadata or None).

  Restores the newest checkpoint under `directory` that verifies onto `mesh`
  (`latest_verified`; metadata: what `save` stored); else a fresh state from
  `load_params()`, which is only called then.
  """
  step = latest_verified(directory)
  mngr = manager(directory, keep=keep)
  if step is not None:
    state, meta = _restore(mngr, abstract_state(model_cfg, cfg, mesh), step)
    return mngr, state, meta
  state = learner.init_state(model_cfg, cfg, load_params(), mesh, jax.random.PRNGKey(seed))
  return mngr, state, None


def export_hf(
  path: str,
  model_cfg: ModelConfig,
  state: learner.TrainState,
  tokenizer=None,
  dtype=None,
  manifest: bool = False,
) -> str:
  """Writes the policy (master params, optionally cast) as an HF directory at `path`; a
  LoRA state is written merged. The directory is written beside `path` and renamed into
  place whole (`fileio.atomic_dir`): nothing of what `path` held before stays in it.
  manifest: with its checksum manifest (`write_manifest`), written before the rename.
  Multi-host: every process calls this; process 0 writes."""
  params = learner.policy_params(state)
  writer = distributed.is_writer()
  with fileio.atomic_dir(path, write=writer) as tmp:
    hf_io.save_hf(tmp, model_cfg, params, tokenizer=tokenizer, dtype=dtype)
    if manifest and writer:
      write_manifest(tmp)
  hf_io._wait_for_writer(path)  # the others return once it is in place
  return path


def export_adapter(
  path: str, model_cfg: ModelConfig, state: learner.TrainState, base: str = ""
) -> str | None:
  """Writes a LoRA state's adapters as a PEFT directory (PEFT's and vLLM's loaders, and
  `lora.init_from` to continue training, read it) whose config names `base` (the base
  model's path or hub id); None for a full fine-tuning state."""
  if not isinstance(state, learner.LoraTrainState):
    return None
  return peft_io.save_adapter(path, model_cfg, state.lora, state.params, base=base)
