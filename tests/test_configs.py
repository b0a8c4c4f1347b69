"""Every experiment config loads and freezes into the library's validated dataclasses."""

from __future__ import annotations

import importlib

import pytest

from rlvr import evaluation, learner, loop, runner
from rlvr.rewards import RewardConfig
from synthesis import svs

CONFIGS = ["tiny", "tiny_rlvr", "rlvr_dapo17k_qwen25_32b", "rlvr_math12k_qwen25_3b",
           "rlvr_math12k_qwen3_4b", "svs_dapo17k_qwen25_32b", "svs_math12k_qwen25_3b",
           "svs_math12k_llama31_8b"]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_freezes(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  runner._frozen(loop.RLConfig, c.rl.loop)
  runner._frozen(learner.LearnerConfig, c.rl.learner)
  runner._frozen(learner.LearnerConfig, c.sft.learner)
  runner._frozen(svs.SvSConfig, c.svs)
  runner._frozen(RewardConfig, c.reward)
  runner._frozen(evaluation.EvalConfig, c.eval.sampling)
  assert c.method in ("rlvr", "svs")


@pytest.mark.parametrize("ablation", ["naive", "asp", "eup", "keep02", "tiny_eup"])
def test_svs_ablations(ablation):
  from configs import svs_ablations
  c = svs_ablations.get_config(ablation)
  cfg = runner._frozen(svs.SvSConfig, c.svs)
  assert cfg != svs.SvSConfig(syntheses_per_solution=cfg.syntheses_per_solution)


def test_unknown_field_is_named():
  with pytest.raises(ValueError, match=r"RLConfig: unknown config fields \['batch'\]"):
    runner._frozen(loop.RLConfig, {"batch": 3})
