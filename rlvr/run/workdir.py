"""A run's work dir and what every phase shares: `setup` reads the config into a `Run`
(tokenizer, mesh, data, eval prompts, `progress.json`), `prepare_model` finds or builds
the starting checkpoint, `check_phases` refuses to reuse a phase made with other
settings, and `lock` keeps one run per work dir across processes."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Mapping

import jax

from rlvr import envs, rollout
from rlvr import model as model_lib
from rlvr.common import fileio, settings
from rlvr.data import datasets
from rlvr.data.prompts import format_prompt
from rlvr.model import gguf_cache, hub
from rlvr.parallel import distributed, sharding
from rlvr.run import experiment
from rlvr.run.sections import EvalSection, ModelSource, SFTConfig


def json_file(path, obj=None):
  """Reads `path`, or atomically writes `obj` there (process 0 only; see `distributed`)."""
  if obj is None:
    with open(path) as f:
      return json.load(f)
  if distributed.is_writer():
    fileio.write_json(path, obj)
  return obj


@dataclasses.dataclass
class Run:
  """What every phase of one run shares."""

  settings: experiment.Settings  # the config, frozen and checked once (`experiment.check`)
  workdir: str
  progress: dict  # finished phases (progress.json)
  model_dir: str  # the HF dir the run starts from
  tokenizer: Any
  mesh: Any
  data: datasets.RunData
  eval_prompts: dict[str, list[rollout.Prompt]]
  model_cfg: model_lib.ModelConfig  # the architecture, read from model_dir once (SFT keeps it)

  @property
  def context(self) -> int:
    """The model's max positions (evaluation skips longer prompts)."""
    return self.model_cfg.max_position_embeddings

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

  def encode(self, text: str) -> list[int]:
    """Solving prompt: the problem plus the run's instruction, in the run's chat template."""
    d = self.settings.data
    return format_prompt(self.tokenizer, text, d.instruction, d.chat_template)

  def encode_task(self, text: str) -> list[int]:
    """Any other task prompt (synthesis, composition): the run's chat template only."""
    return format_prompt(self.tokenizer, text, "", self.settings.data.chat_template)

  def prompts(self, examples, source: str) -> list[rollout.Prompt]:
    return [
      rollout.Prompt(tuple(self.encode(e.problem)), e.answer, e.problem, e.source or source)
      for e in examples
    ]

  def save_progress(self) -> None:
    json_file(os.path.join(self.workdir, "progress.json"), self.progress)


CACHE_ENV = "RLVR_CACHE_DIR"  # the model cache when model.cache_dir is ""


def cache_dir(setting: str) -> str:
  """Where built models (tiny random ones, converted GGUF files) are kept: model.cache_dir,
  else $RLVR_CACHE_DIR, else ~/.cache/rlvr."""
  return os.path.expanduser(setting or os.environ.get(CACHE_ENV) or "~/.cache/rlvr")


def resolve_model(path: str, field: str, cache: str = "") -> str:
  """The HF dir of a model path as users write it: a GGUF file or the short name of one,
  converted once into the model cache (`cache`: as model.cache_dir), else an HF dir or a
  hub id (`hub.resolve`). A bad path or file is one line naming `field`."""
  gguf = gguf_cache.locate(os.path.expanduser(path), field)
  if gguf is not None:
    return gguf_cache.cached(gguf, cache_dir(cache), field)
  return hub.resolve(path, field)


def prepare_model(m: ModelSource) -> str:
  """The HF dir to start from: `model.path` (a GGUF file or short name of one is converted
  once into the model cache), or a cached `make_tiny` build (a line names the cache, which
  is outside the work dir)."""
  if m.path:
    return resolve_model(m.path, "model.path", m.cache_dir)
  tiny = m.tiny.to_dict() if hasattr(m.tiny, "to_dict") else dict(m.tiny)
  key = hashlib.sha1(json.dumps(tiny, sort_keys=True).encode()).hexdigest()[:10]
  path = os.path.join(cache_dir(m.cache_dir), f"tiny-{key}")
  built = not os.path.exists(os.path.join(path, "config.json"))
  if built:
    tmp = path + f".tmp{os.getpid()}"
    model_lib.make_tiny(tmp, **tiny)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
      os.replace(tmp, path)
    except OSError:  # another run built the same model meanwhile: use that one
      if not os.path.exists(os.path.join(path, "config.json")):
        raise
      shutil.rmtree(tmp, ignore_errors=True)
  print(
    f"model: tiny random model {'built in' if built else 'from'} {path} "
    f"(model.cache_dir or ${CACHE_ENV} moves it)",
    flush=True,
  )
  return path


def setup(s: experiment.Settings) -> Run:
  """The run's work dir, model, data, mesh and tokenizer (after `distributed.initialize`, which
  `runner.run` calls once, first), for the settings `experiment.check` returned."""
  from transformers import AutoTokenizer

  workdir = os.path.abspath(s.workdir)
  os.makedirs(workdir, exist_ok=True)
  distributed.check_shared_workdir(workdir)
  progress_path = os.path.join(workdir, "progress.json")
  progress = json_file(progress_path) if os.path.exists(progress_path) else {}
  model_dir = prepare_model(s.model)
  data = datasets.prepare(s.data, s.seed)
  json_file(os.path.join(workdir, "config.json"), s.written)  # what launch.evaluate --run reads
  mesh = sharding.make_mesh(dict(s.mesh))
  if jax.process_count() > 1:
    print(
      f"process {jax.process_index()} of {jax.process_count()}: global mesh "
      f"{dict(mesh.shape)} over {jax.device_count()} devices "
      f"({jax.local_device_count()} here)",
      flush=True,
    )
  run = Run(
    s,
    workdir,
    progress,
    model_dir,
    AutoTokenizer.from_pretrained(model_dir),
    mesh,
    data,
    {},
    model_lib.ModelConfig.from_hf(model_dir),
  )
  run.eval_prompts = {name: run.prompts(exs, name) for name, exs in data.evals.items()}
  return run


def _flat(d: dict, prefix: str) -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


# Settings that change where a phase's inputs are kept, not what the phase makes.
_PLACE_ONLY = ("model.cache_dir",)


def _defaults() -> dict:
  """Every phase setting at its default: a field a record predates ran at its default."""
  sections = {
    "data.": datasets.DataConfig,
    "model.": ModelSource,
    "sft.": SFTConfig,
    "eval.": EvalSection,
    "env.": envs.EnvConfig,
  }
  out = {}
  for prefix, cls in sections.items():
    out.update(_flat(json.loads(json.dumps(settings.section(cls).to_dict())), prefix))
  return out


def phase_settings(d: Mapping[str, Any]) -> dict[str, dict]:
  """The settings each reusable phase depends on, flat ("sft.steps": 400, ...), from the
  config as JSON values (`Settings.written`: tuples as lists, as progress.json holds them)."""
  data = _flat(d["data"], "data.")
  model = {k: v for k, v in _flat(d["model"], "model.").items() if k not in _PLACE_ONLY}
  made = {"seed": d["seed"], **model, **data}
  return {
    "sft": {**made, **_flat(d["sft"], "sft.")},
    "eval": {
      **made,
      **_flat(d["eval"]["sampling"], "eval.sampling."),
      **_flat(d.get("env", {}), "env."),  # evaluations run in the run's environment
    },
  }


def check_phases(run: Run) -> None:
  """A phase that a rerun would reuse, asked for with other settings, stops the run with one
  line naming the first changed field; settings of phases not yet recorded are recorded."""
  done = run.progress.setdefault("settings", {})
  derived = experiment.derived_paths()
  for phase, now in phase_settings(run.settings.written).items():
    recorded = done.setdefault(phase, now)
    # A derived field (sft.learner.total_steps) follows its source, which is compared itself.
    was = {k: v for k, v in recorded.items() if k not in _PLACE_ONLY and k not in derived}
    # A field the record predates ran at its default; it is recorded from now on.
    defaults = _defaults()
    for k in set(now) - set(was):
      if k in defaults and now[k] == defaults[k]:
        was[k] = recorded[k] = now[k]
    changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    if changed:
      k = changed[0]
      raise ValueError(
        f"{k}: the {phase} phase recorded in {run.workdir}/progress.json ran with "
        f"{was.get(k)!r}, this run asks for {now.get(k)!r}; rerun with the recorded "
        "settings, or give a new --workdir"
      )
  run.save_progress()


@contextlib.contextmanager
def lock(workdir: str):
  """Process 0 holds the lock; on several processes, all stop when it could not take it."""
  if jax.process_count() == 1:
    with fileio.workdir_lock(workdir):
      yield
    return
  import numpy as np
  from jax.experimental import multihost_utils

  with contextlib.ExitStack() as stack:
    error = None
    if distributed.is_writer():
      try:
        stack.enter_context(fileio.workdir_lock(workdir))
      except (fileio.WorkdirBusyError, OSError) as e:
        error = e
    held = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if error is not None:
      raise error
    if not held:
      raise fileio.WorkdirBusyError(
        f"work dir {workdir}: process 0 could not take its lock (its output says why)"
      )
    yield
