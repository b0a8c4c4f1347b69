"""Orbax checkpoints of the TrainState plus JSON metadata; HF export of the policy.

Restoring takes an abstract state whose leaves carry the target shardings, so
a run can resume on a different mesh (orbax reshards on read).
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from rlvr import learner
from rlvr.model import decoder, hf_io
from rlvr.model.config import ModelConfig


def manager(directory: str, keep: int = 3) -> ocp.CheckpointManager:
  """CheckpointManager keeping the last `keep` steps under `directory`."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
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
  *,
  wait: bool = True,
) -> int:
  """Saves `state` with metadata (data position, config, ...) + versions.

  The checkpoint's step is metadata["step"] when given: the RL loop's position,
  which differs from the optimizer's update count (`state.step`) once a step makes
  several optimizer steps (mini-batches) or none (an empty buffer). Else state.step.
  """
  step = (
    int(metadata["step"]) if metadata and "step" in metadata else int(jax.device_get(state.step))
  )
  meta = dict(metadata or {}, step=step, versions=versions())
  mngr.save(
    step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
  )
  if wait:
    mngr.wait_until_finished()
  return step


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
  """(state, metadata) of `step` (default: latest) placed as `target` says."""
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {mngr.directory}")
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

  Restores the latest checkpoint under `directory` onto `mesh` when there is
  one (metadata: what `save` stored); else a fresh state from `load_params()`,
  which is only called then.
  """
  mngr = manager(directory, keep=keep)
  if mngr.latest_step() is not None:
    state, meta = restore(mngr, abstract_state(model_cfg, cfg, mesh))
    return mngr, state, meta
  state = learner.init_state(model_cfg, cfg, load_params(), mesh, jax.random.PRNGKey(seed))
  return mngr, state, None


def export_hf(
  path: str,
  model_cfg: ModelConfig,
  state: learner.TrainState,
  tokenizer=None,
  dtype=None,
  cfg: learner.LearnerConfig | None = None,
) -> str:
  """Writes the policy (master params, optionally cast) as an HF directory.

  A LoRA state is written merged, which needs its learner config (`cfg`)."""
  if isinstance(state, learner.LoraTrainState) and cfg is None:
    raise ValueError("export_hf: a LoRA state (adapters on a base) needs cfg= to merge them")
  params = state.params if cfg is None else learner.policy_params(state, cfg)
  return hf_io.save_hf(path, model_cfg, params, tokenizer=tokenizer, dtype=dtype)
