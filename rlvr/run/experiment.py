"""Every check made before a run starts, and the settings it returns.

`check(cfg)` freezes every section of the config (the run's own, `rlvr.run.sections`, and
the library's dataclasses), so each field's range is checked by its dataclass, then checks
the rules that span sections; it runs before anything is built or trained, and each error is
one line naming the fields. What it returns, `Settings`, is all of the run that travels past
launch: no ConfigDict does.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import typing
from typing import Any, Mapping

import jax

from rlvr import envs, learner, methods, rollout
from rlvr.common import named, settings
from rlvr.data import datasets
from rlvr.rewards import RewardConfig, shaping
from rlvr.run import evaluation
from rlvr.run.sections import (
  CheckpointConfig,
  EvalSection,
  HealthConfig,
  LoggingConfig,
  ModelSource,
  SFTConfig,
)
from rlvr.sampling.config import SamplerConfig

# Section name -> its dataclass; `check` freezes each one under its full name.
SECTIONS = {
  "model": ModelSource,
  "data": datasets.DataConfig,
  "sampler": SamplerConfig,
  "sft": SFTConfig,
  "rl.loop": rollout.RLConfig,
  "rl.learner": learner.LearnerConfig,
  "reward": RewardConfig,
  "shaping": shaping.ShapingConfig,
  "eval": EvalSection,
  "checkpoint": CheckpointConfig,
  "logging": LoggingConfig,
  "env": envs.EnvConfig,
  "health": HealthConfig,
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every setting of a run, typed and checked: the top-level values, each section as its
  validated dataclass, and the method's own (`methods.MethodSettings`)."""

  seed: int
  workdir: str
  coordinator: str  # multi-host: "host:port" or "auto"; "" = one process
  mesh: Mapping[str, int]
  export_hf: bool
  reward_workers: int
  rl_steps: int
  rl_log_samples_every: int
  method: methods.MethodSettings
  written: Mapping[str, Any]  # the whole config as JSON values: config.json, the progress
  # records of reusable phases, the trackers' run config
  model: ModelSource
  data: datasets.DataConfig
  sampler: SamplerConfig
  sft: SFTConfig
  rl_loop: rollout.RLConfig
  rl_learner: learner.LearnerConfig
  reward: RewardConfig
  shaping: shaping.ShapingConfig
  eval: EvalSection
  checkpoint: CheckpointConfig
  logging: LoggingConfig
  env: envs.EnvConfig
  health: HealthConfig


def _section(cfg, dotted: str):
  node = cfg
  for part in dotted.split("."):
    node = node[part]
  return node


def _installed(module: str) -> bool:
  return importlib.util.find_spec(module) is not None


# Config paths that moved -> where they are now: a config that still sets one is told.
MOVED = {f"rl.loop.{name}": f"rl.learner.{name}" for name in learner.RL_ONLY}


def moved_line(old: str) -> str | None:
  """The one line for a config path that moved (`MOVED`), None for any other path."""
  return f"{old}: moved to {MOVED[old]}; set that instead" if old in MOVED else None


def _derived_fields(name: str, cls):
  """(config path, source path) of every derived field of section `name` and the sections
  nested in it (`sft.learner.total_steps` -> `sft.steps`)."""
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    if settings.DERIVED in f.metadata:
      yield f"{name}.{f.name}", settings.source_path(name, f.metadata[settings.DERIVED])
    elif dataclasses.is_dataclass(hints[f.name]):
      yield from _derived_fields(f"{name}.{f.name}", hints[f.name])


def derived_paths() -> dict[str, str]:
  """Config paths that are not set in their section -> the path their value comes from
  (`settings.derived`: rl.loop.seed -> seed, sft.learner.total_steps -> sft.steps)."""
  return {
    path: source for name, cls in SECTIONS.items() for path, source in _derived_fields(name, cls)
  }


def _replaced(value, parts: list[str], new):
  """The frozen dataclass `value` with the field at `parts` (nested) set to `new`."""
  head, *rest = parts
  inner = _replaced(getattr(value, head), rest, new) if rest else new
  return dataclasses.replace(value, **{head: inner})


def _frozen(cfg, name: str, cls):
  """Section `name` as its dataclass, with its derived fields filled from their sources."""
  value = settings.frozen(cls, _section(cfg, name), prefix=f"{name}.")
  for path, source in _derived_fields(name, cls):
    value = _replaced(value, path[len(name) + 1 :].split("."), _section(cfg, source))
  return value


def check(cfg) -> Settings:
  """All sections of `cfg` frozen and checked, then the rules that span sections."""
  for old in MOVED:
    section, _, key = old.rpartition(".")
    if key in _section(cfg, section):
      raise ValueError(moved_line(old))
  if cfg.rl.steps < 0:  # first: rl.learner.total_steps is derived from it
    raise ValueError(f"rl.steps: must be >= 0, got {cfg.rl.steps}")
  every = cfg.rl.log_samples_every
  if isinstance(every, bool) or not isinstance(every, int) or every < 0:
    raise ValueError(f"rl.log_samples_every: must be an integer >= 0 (0 = off), got {every!r}")
  s = Settings(
    seed=int(cfg.seed),
    workdir=str(cfg.workdir),
    coordinator=str(cfg.get("coordinator") or ""),
    mesh=dict(cfg.mesh),
    export_hf=bool(cfg.export_hf),
    reward_workers=int(cfg.reward_workers),
    rl_steps=int(cfg.rl.steps),
    rl_log_samples_every=every,
    method=methods.check(cfg),  # the method's own section, with the settings it spans
    written=json.loads(json.dumps(cfg.to_dict())),  # tuples as lists, as JSON holds them
    **{name.replace(".", "_"): _frozen(cfg, name, cls) for name, cls in SECTIONS.items()},
  )
  lc, rl = s.rl_learner, s.rl_loop
  if s.sampler.lora_adapters and not lc.lora.rank:
    raise ValueError(
      "sampler.lora_adapters: pushes LoRA adapters, which need rl.learner.lora.rank > 0"
    )
  if lc.pack and lc.attention == "cudnn":
    raise ValueError(
      "rl.learner.pack: packed rows (several sequences per row) need "
      "rl.learner.attention auto|dense|blockwise; cudnn takes one per row"
    )
  split = lc.micro_batch_rows or lc.micro_batches or 1
  if lc.pack and lc.pack_min_rows % split:
    raise ValueError(
      f"rl.learner.pack_min_rows: {lc.pack_min_rows} packed rows do not split by "
      f"{split} (rl.learner.micro_batch_rows, or micro_batches); use a multiple"
    )
  if rl.max_staleness and lc.old_logp != "learner":
    raise ValueError(
      "rl.learner.old_logp: 'sampler' with rl.loop.max_staleness=1 would clip against "
      "weights one update behind the learner's; use 'learner' (TIS still uses the sampler's)"
    )
  sft_default = learner.LearnerConfig()
  for name in learner.RL_ONLY:
    if getattr(s.sft.learner, name) != getattr(sft_default, name):
      raise ValueError(
        f"sft.learner.{name}: an RL setting (advantages, mini-batches of groups, old "
        f"log-probs, packing); SFT does not read it, set rl.learner.{name}"
      )
  if s.logging.wandb and s.logging.wandb_mode != "disabled" and not _installed("wandb"):
    raise ValueError(  # here, not after SFT; the text of rlvr.report.metrics.WANDB_MISSING
      "logging.wandb: the wandb package is not installed; pip install wandb "
      "(or pip install -e '.[tracking]'), or leave logging.wandb False"
    )
  named.load("env.name", s.env.name, envs.ENVIRONMENTS, "an environment", "factory")
  first_turn = rl.max_prompt_len + rl.max_response_len
  if s.env.max_total_tokens and s.env.max_total_tokens < first_turn:
    raise ValueError(
      f"env.max_total_tokens: {s.env.max_total_tokens} is less than one turn after the "
      f"longest prompt (rl.loop.max_prompt_len + rl.loop.max_response_len = {first_turn}); "
      "raise it, or 0 for exactly that"
    )
  return s


def check_env_fits(env: envs.EnvConfig, context: int) -> None:
  """An episode budget past the model's positions."""
  if env.max_total_tokens > context:
    raise ValueError(
      f"env.max_total_tokens: {env.max_total_tokens} tokens do not fit the model's "
      f"{context} positions; lower it"
    )


def check_eval_fits(
  ecfg: evaluation.EvalConfig, context: int, prefix: str = "eval.sampling."
) -> None:
  """An eval response limit that leaves no room for any prompt in the model's context."""
  if ecfg.max_tokens >= context:
    raise ValueError(
      f"{prefix}max_tokens: {ecfg.max_tokens} response tokens leave no room "
      f"for a prompt in the model's {context} positions; lower it"
    )


def scale_down(cfg, steps: int = 2):
  """A copy of `cfg` that runs `steps` RL steps on this machine's CPU devices.

  What changes is the scale, never the method: the mesh spans the local devices, the
  in-process JAX sampler replaces vLLM servers (a URL teacher becomes the policy), lengths,
  prompts per step, mini-batches, eval problems and samples shrink, micro-batches and
  packing fall to one row, and the run writes under workdir/cpu_<name>. Every setting can
  still be overridden after it by `--config.x=...` (configs/cpu.py).
  """
  c = cfg.copy_and_resolve_references()
  c.workdir = os.path.join("workdir", "cpu_" + os.path.basename(os.path.normpath(c.workdir)))
  c.mesh = {"data": 1, "fsdp": -1, "tensor": 1}
  c.reward_workers = 2
  c.reward.code.workers = min(c.reward.code.workers, 4)  # sandboxes at once
  c.sampler.kind = "jax"
  c.rl.steps = steps
  c.checkpoint.every = steps
  loop = c.rl.loop
  loop.prompts_per_step = 4
  loop.max_prompt_len = min(loop.max_prompt_len, 512)
  loop.max_response_len = min(loop.max_response_len, 32)
  lrn = c.rl.learner
  lrn.ppo_mini_batch_size = 2 if lrn.ppo_mini_batch_size else 0  # multi-step stays
  lrn.pack_len, lrn.pack_min_rows = 0, jax.device_count()  # a packed row per device
  lrn.micro_batch_rows, lrn.micro_batches = 0, 1
  lrn.compute_dtype = "float32"
  c.sft.steps = min(c.sft.steps, steps)
  c.sft.batch_size = min(c.sft.batch_size, 8)
  c.data.eval_limit = 8
  c.eval.every = 0
  if c.env.max_total_tokens:  # an episode's budget shrinks with its turns
    c.env.max_total_tokens = loop.max_prompt_len + 3 * loop.max_response_len
  c.env.workers = min(c.env.workers, 4)  # tool calls at once
  ev = c.eval.sampling
  ev.n, ev.max_tokens, ev.batch_prompts, ev.seeds = 2, 32, 16, (0,)
  c.svs.syntheses_per_solution = 2
  c.composition.max_steps = 1
  q = c.qbq
  q.rounds, q.steps_per_round, q.k, q.initial_seeds, q.select_n = 1, steps, 4, 4, 4
  q.score_max_tokens = q.teacher_max_tokens = 32
  if q.teacher.startswith(("http://", "https://")) or not q.teacher:
    q.teacher = "policy"
  return c


def check_mesh(s: Settings, mesh_shape: dict[str, int]) -> None:
  """Batch sizes the data-parallel devices (mesh data x fsdp x expert) do not split."""
  dp = mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1) * mesh_shape.get("expert", 1)
  rl, lc = s.rl_loop, s.rl_learner
  sizes = [
    ("rl.learner.pack_min_rows", lc.pack_min_rows)
    if lc.pack
    else ("rl.loop.prompts_per_step x group_size", rl.rows)
  ]
  if s.sft.steps:
    sizes.append(("sft.batch_size", s.sft.batch_size))
  for name, rows in sizes:
    if rows % dp:
      raise ValueError(
        f"{name}: {rows} rows do not split over the {dp} data-parallel devices "
        f"(mesh data x fsdp x expert = {dp}); use a multiple of {dp} or another mesh"
      )
