"""The run-level sections of an experiment config.

The library's own dataclasses (`learner.LearnerConfig`, `rollout.RLConfig`,
`datasets.DataConfig`, `sampling.config.SamplerConfig`, ...) hold their sections'
defaults; this module holds the sections that belong to a run as a whole (model,
SFT, evaluation, checkpoints, logging, health warnings). `rlvr.run.experiment.check`
freezes them with the others.
"""

from __future__ import annotations

import dataclasses
import os

from rlvr import learner
from rlvr.run import evaluation


@dataclasses.dataclass(frozen=True)
class ModelSource:
  path: str = ""  # HF dir or hub id of the policy; "" = a tiny random one
  cache_dir: str = ""  # where tiny models and converted GGUF files are cached; "" =
  # $RLVR_CACHE_DIR, else ~/.cache/rlvr
  tiny: dict = dataclasses.field(default_factory=dict)  # make_tiny overrides (path "")


def _sft_learner() -> learner.LearnerConfig:
  return learner.LearnerConfig(learning_rate=1e-5, weight_decay=0.0, dual_clip=None)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 0  # 0 = no SFT warm start
  batch_size: int = 64
  learner: learner.LearnerConfig = dataclasses.field(default_factory=_sft_learner)
  # learner.lora.rank > 0: LoRA adapters on the frozen model, exported merged (rlvr.model.lora)
  init_from: str = ""  # a finished SFT to start RL from instead of training one: a run's
  # work dir, its sft/ dir or the sft/model/ dir itself (`sft.reuse`)

  def __post_init__(self):
    if self.init_from and not os.path.isdir(self.init_from):
      raise ValueError(f"init_from: {self.init_from!r} is not a directory")
    if self.steps < 0 or self.batch_size < 1:
      raise ValueError(
        f"steps / batch_size: must be >= 0 / >= 1, got {self.steps} / {self.batch_size}"
      )


@dataclasses.dataclass(frozen=True)
class EvalSection:
  every: int = 0  # also evaluate every N RL steps (0 = before/after only)
  samples: bool = False  # before/after RL: every response, samples_*.jsonl
  sampling: evaluation.EvalConfig = evaluation.EvalConfig()

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f"every: must be >= 0 (0 = before and after RL only), got {self.every}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  every: int = 20  # RL steps between checkpoints (SFT: 10x as many)
  keep: int = 3
  export_every: int = 0  # also write the policy as an HF dir every N RL steps,
  # workdir/policy_steps/step_<k> (LoRA: and workdir/policy_adapter_steps/step_<k>); 0 = at
  # the end only

  def __post_init__(self):
    if self.every < 1 or self.keep < 1:
      raise ValueError(f"every / keep: must be >= 1, got {self.every} / {self.keep}")
    if self.export_every < 0:
      raise ValueError(f"export_every: must be >= 0 (0 = none), got {self.export_every}")


WANDB_MODES = ("online", "offline", "disabled")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  """Where a run's metrics go besides metrics.jsonl, which is always written
  (`rlvr.report.metrics.MetricsWriter`; docs/tracking.md)."""

  tensorboard: bool = True  # TensorBoard event files under workdir/tensorboard
  wandb: bool = False  # also log to Weights & Biases (pip install wandb)
  wandb_project: str = "rlvr"
  wandb_entity: str = ""  # team or user; "" = wandb's default
  wandb_name: str = ""  # the run's display name; "" = the work dir's name
  wandb_tags: tuple[str, ...] = ()
  wandb_mode: str = ""  # online | offline | disabled; "" = $WANDB_MODE, else online
  wandb_dir: str = ""  # where wandb keeps its files; "" = $WANDB_DIR, else the work dir

  def __post_init__(self):
    if self.wandb_mode and self.wandb_mode not in WANDB_MODES:
      raise ValueError(
        f"wandb_mode: unknown {self.wandb_mode!r}; expected one of {', '.join(WANDB_MODES)} "
        "(or empty for $WANDB_MODE)"
      )


@dataclasses.dataclass(frozen=True)
class HealthConfig:
  """When the run's health warnings fire (`rlvr.report.health.Monitor`; docs/health.md).

  A trend compares the mean of the last `window` steps with the mean of the run's first
  `window` steps; a spike compares one step with the median of the `window` steps before it;
  a streak counts steps in a row. So no trend fires before 2 x window steps, no spike before
  window + 1 and no streak before `streak`."""

  enabled: bool = True  # watch every RL step's metrics; False = no warnings
  window: int = 10  # steps in the first (baseline) and the trailing means
  reward_rise: float = 0.1  # reward_mean up by this much (reward units) ...
  correct_rise: float = 0.02  # ... while correctness rises less: reward_without_correctness
  length_ratio: float = 2.0  # response_len_mean x this: length_explodes; / this: length_collapses
  truncated_rise: float = 0.2  # truncated_frac up by this much: truncation_climbs
  entropy_ratio: float = 0.3  # entropy down to this share of its start: entropy_collapses
  repetition_rise: float = 0.15  # repeated_3gram_frac up by this much: repetition_rises
  spike_factor: float = 5.0  # a step's KL (ratio_max - 1) over this x the median before it
  kl_floor: float = 0.01  # ... and at least this: kl_spike
  ratio_floor: float = 2.0  # ... and ratio_max at least this: ratio_spike
  streak: int = 10  # steps in a row for all_wrong and no_signal
  all_wrong_share: float = 0.75  # solve_none at least this each step: all_wrong
  no_signal_share: float = 0.9  # groups all right or all wrong at least this, or the update
  # skipped, each step: no_signal
  format_rise: float = 0.2  # the well-formed share up by this much while correctness rises
  # less than correct_rise: format_only

  def __post_init__(self):
    if self.window < 1 or self.streak < 1:
      raise ValueError(f"window / streak: must be >= 1, got {self.window} / {self.streak}")
    if not (self.length_ratio > 1 and self.spike_factor > 1 and self.ratio_floor > 1):
      raise ValueError(
        f"length_ratio / spike_factor / ratio_floor: must be > 1, got {self.length_ratio} / "
        f"{self.spike_factor} / {self.ratio_floor}"
      )
    shares = {
      "entropy_ratio": self.entropy_ratio,
      "all_wrong_share": self.all_wrong_share,
      "no_signal_share": self.no_signal_share,
    }
    for name, v in shares.items():
      if not 0 < v <= 1:
        raise ValueError(f"{name}: must be in (0, 1], got {v}")
    rises = ("reward_rise", "correct_rise", "truncated_rise", "repetition_rise", "kl_floor")
    for name in (*rises, "format_rise"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
