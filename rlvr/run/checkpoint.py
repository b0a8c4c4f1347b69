"""Orbax checkpoints of the TrainState plus JSON metadata; HF export of the policy.

Restoring takes an abstract state whose leaves carry the target shardings, so
a run can resume on a different mesh (orbax reshards on read).

Every step saved carries a checksum manifest, and only a step that verifies is restored
(`checkpoint_integrity`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import shutil
import time
import traceback
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from rlvr import learner
from rlvr.common import fileio
from rlvr.model import decoder, hf_io, peft_io
from rlvr.model.config import ModelConfig
from rlvr.parallel import distributed
from rlvr.run import checkpoint_integrity


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
  every process has written it, then process 0 writes its manifest
  (`checkpoint_integrity.write_manifest`).

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
      checkpoint_integrity.write_manifest(step_dir)
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
  does not verify raises `checkpoint_integrity.CheckpointError` (`restore_or_init` falls
  back instead)."""
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {mngr.directory}")
  step_dir = os.path.join(str(mngr.directory), str(step))
  problem = checkpoint_integrity.verify(step_dir)
  if problem is not None:
    raise checkpoint_integrity.CheckpointError(
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
  (`checkpoint_integrity.latest_verified`; metadata: what `save` stored); else a fresh
  state from `load_params()`, which is only called then.
  """
  step = checkpoint_integrity.latest_verified(directory)
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
  manifest: with its checksum manifest (`checkpoint_integrity.write_manifest`), written
  before the rename.
  Multi-host: every process calls this; process 0 writes."""
  params = learner.policy_params(state)
  writer = distributed.is_writer()
  with fileio.atomic_dir(path, write=writer) as tmp:
    hf_io.save_hf(tmp, model_cfg, params, tokenizer=tokenizer, dtype=dtype)
    if manifest and writer:
      checkpoint_integrity.write_manifest(tmp)
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
