"""Environments a policy acts in over several turns (`env` config section).

from rlvr import envs
runner = envs.Episodes(envs.make(cfg), cfg, decode=..., encode=...)
outs = runner.generate(sampler, prompt_ids, params)  # one Completion per episode
"""

from rlvr.envs.base import Environment, Episode, SingleTurn
from rlvr.envs.config import TOOL_LIMITS, EnvConfig
from rlvr.envs.episode_metrics import episode_metrics, episode_record
from rlvr.envs.episodes import Episodes, cut_at_stop, episodes_for
from rlvr.envs.registry import ENVIRONMENTS, for_run, make

__all__ = [
  "ENVIRONMENTS",
  "TOOL_LIMITS",
  "EnvConfig",
  "Environment",
  "Episode",
  "Episodes",
  "SingleTurn",
  "cut_at_stop",
  "episode_metrics",
  "episode_record",
  "episodes_for",
  "for_run",
  "make",
]
