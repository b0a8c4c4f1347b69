"""The environments `env.name` picks from, `make`, and `for_run`: a run's episodes."""

from __future__ import annotations

from typing import Callable

import jax

from rlvr.common import named
from rlvr.envs.base import Environment, SingleTurn
from rlvr.envs.config import EnvConfig
from rlvr.envs.episodes import Episodes, episodes_for
from rlvr.envs.python_tool import PythonTool

ENVIRONMENTS: dict[str, Callable[[EnvConfig], Environment]] = {
  "single_turn": SingleTurn,
  "python_tool": PythonTool,
}


def make(cfg: EnvConfig) -> Environment:
  """The environment `cfg.name` names: a built-in, or "package.module:function" called
  with the config."""
  factory = named.load("env.name", cfg.name, ENVIRONMENTS, "an environment", "factory")
  try:
    env = factory(cfg)
  except Exception as e:  # noqa: BLE001 - a user's factory that fails: one line naming it
    if cfg.name in ENVIRONMENTS:
      raise
    raise ValueError(f"env.name: {cfg.name!r} raised {type(e).__name__}: {e}") from e
  if not isinstance(getattr(env, "stop", None), tuple) or not callable(
    getattr(env, "observe", None)
  ):
    raise ValueError(
      f"env.name: {cfg.name!r} made a {type(env).__name__}, which is not an Environment "
      "(needs a `stop` tuple of strings and an `observe(episode, turn)` method)"
    )
  return env


def for_run(cfg: EnvConfig, tokenizer) -> Episodes:
  """A run's episodes in the environment `cfg` names, over its tokenizer; over several
  processes, every process takes process 0's observations (one allgather per turn)."""
  agree = None
  if jax.process_count() > 1:
    from rlvr.parallel import distributed

    agree = distributed.agreed(lambda rows: rows)
  return episodes_for(cfg, make(cfg), tokenizer, agree)
