"""A whole run as a short pipeline: set up -> SFT -> evaluate -> train -> evaluate -> summary.

`run(config)` is what `launch/train.py` calls. Every phase writes into the
work dir, and rerunning the same command resumes: a finished SFT phase is
reloaded from `sft/model/`, RL from its last orbax checkpoint together with
the method's own state (data position, curriculum, question bank), finished
evaluations from `progress.json`. The RL method comes from `methods.make`;
nothing here depends on which one it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp

from rlvr import (
  buffer_file,
  checkpoint,
  datasets,
  distributed,
  evaluation,
  experiment,
  fileio,
  interrupt,
  learner,
  loop,
  methods,
  samples_log,
  settings,
  sft,
  shaping,
  sharding,
)
from rlvr import metrics as metrics_lib
from rlvr import model as model_lib
from rlvr.data import format_prompt
from rlvr.model import hub
from rlvr.rewards.verifiers import open_verifier
from rlvr.sampling import JaxSampler

# training.png's panels (`metrics.plot_metrics`): held-out pass@1 first, then the RL step's.
PLOT_KEYS = (
  metrics_lib.HELDOUT,
  "accuracy",
  "reward_mean",
  "entropy",
  metrics_lib.Panel(
    "Training groups all or none correct",
    "fraction of groups",
    (
      ("solve_all", "all correct (too easy: no signal)"),
      ("solve_none", "none correct (too hard: no signal)"),
    ),
  ),
  "response_len_mean",
  "truncated_frac",
  "optimizer_steps",
  metrics_lib.Panel(
    "Tokens clipped by the PPO ratio",
    "fraction of tokens",
    (
      ("clip_frac_high", "high: ratio > 1 + eps_high, A > 0"),
      ("clip_frac_low", "low: ratio < 1 - eps_low, A < 0"),
    ),
  ),
  "kl_first_last",
  "grad_norm",
  "shaping_overlong",
  metrics_lib.Panel(
    "Wall time per RL step",
    "seconds",
    (
      ("time_step", "whole step"),
      ("time_sample", "sampling"),
      ("time_score", "scoring"),
      ("time_update", "update"),
      ("time_sync", "weight sync"),
    ),
  ),
)


def _json(path, obj=None):
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

  cfg: Any  # the ml_collections config
  workdir: str
  progress: dict  # finished phases (progress.json)
  model_dir: str  # the HF dir the run starts from
  tokenizer: Any
  mesh: Any
  data: datasets.RunData
  eval_prompts: dict[str, list[loop.Prompt]]
  context: int  # the model's max positions (evaluation skips longer prompts)

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

  def encode(self, text: str) -> list[int]:
    """Solving prompt: the problem plus the run's instruction, in the run's chat template."""
    d = self.cfg.data
    return format_prompt(self.tokenizer, text, d.instruction, d.chat_template)

  def encode_task(self, text: str) -> list[int]:
    """Any other task prompt (synthesis, composition): the run's chat template only."""
    return format_prompt(self.tokenizer, text, "", self.cfg.data.chat_template)

  def prompts(self, examples, source: str) -> list[loop.Prompt]:
    return [
      loop.Prompt(tuple(self.encode(e.problem)), e.answer, e.problem, e.source or source)
      for e in examples
    ]

  def save_progress(self) -> None:
    _json(os.path.join(self.workdir, "progress.json"), self.progress)


# --------------------------------------------------------------------- phases
CACHE_ENV = "RLVR_CACHE_DIR"  # where tiny models are cached when model.cache_dir is ""


def cache_dir(setting: str) -> str:
  """model.cache_dir, else $RLVR_CACHE_DIR, else ~/.cache/rlvr."""
  return os.path.expanduser(setting or os.environ.get(CACHE_ENV) or "~/.cache/rlvr")


def prepare_model(cfg) -> str:
  """The HF dir to start from: `model.path`, or a cached `make_tiny` build (a line names
  the cache, which is outside the work dir)."""
  if cfg.model.path:
    return hub.resolve(cfg.model.path, "model.path")
  tiny = cfg.model.tiny.to_dict() if hasattr(cfg.model.tiny, "to_dict") else dict(cfg.model.tiny)
  key = hashlib.sha1(json.dumps(tiny, sort_keys=True).encode()).hexdigest()[:10]
  path = os.path.join(cache_dir(cfg.model.cache_dir), f"tiny-{key}")
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


def setup(cfg) -> Run:
  from transformers import AutoTokenizer

  distributed.initialize(cfg.get("coordinator") or None)
  workdir = os.path.abspath(cfg.workdir)
  os.makedirs(workdir, exist_ok=True)
  distributed.check_shared_workdir(workdir)
  progress_path = os.path.join(workdir, "progress.json")
  progress = _json(progress_path) if os.path.exists(progress_path) else {}
  model_dir = prepare_model(cfg)
  data = datasets.prepare(cfg.data, cfg.seed)
  _json(os.path.join(workdir, "config.json"), cfg.to_dict())  # what launch.evaluate --run reads
  mesh = sharding.make_mesh(cfg.mesh.to_dict())
  if jax.process_count() > 1:
    print(
      f"process {jax.process_index()} of {jax.process_count()}: global mesh "
      f"{dict(mesh.shape)} over {jax.device_count()} devices "
      f"({jax.local_device_count()} here)",
      flush=True,
    )
  run = Run(
    cfg,
    workdir,
    progress,
    model_dir,
    AutoTokenizer.from_pretrained(model_dir),
    mesh,
    data,
    {},
    model_lib.ModelConfig.from_hf(model_dir).max_position_embeddings,
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
    "model.": experiment.ModelSource,
    "sft.": experiment.SFTConfig,
    "eval.": experiment.EvalSection,
  }
  out = {}
  for prefix, cls in sections.items():
    out.update(_flat(json.loads(json.dumps(settings.section(cls).to_dict())), prefix))
  return out


def phase_settings(cfg) -> dict[str, dict]:
  """The settings each reusable phase depends on, flat ("sft.steps": 400, ...)."""
  d = json.loads(json.dumps(cfg.to_dict()))  # tuples as lists, as progress.json holds them
  data = _flat(d["data"], "data.")
  model = {k: v for k, v in _flat(d["model"], "model.").items() if k not in _PLACE_ONLY}
  made = {"seed": d["seed"], **model, **data}
  return {
    "sft": {**made, **_flat(d["sft"], "sft.")},
    "eval": {**made, **_flat(d["eval"]["sampling"], "eval.sampling.")},
  }


def check_phases(run: Run) -> None:
  """A phase that a rerun would reuse, asked for with other settings, stops the run with one
  line naming the first changed field; settings of phases not yet recorded are recorded."""
  done = run.progress.setdefault("settings", {})
  for phase, now in phase_settings(run.cfg).items():
    recorded = done.setdefault(phase, now)
    was = {k: v for k, v in recorded.items() if k not in _PLACE_ONLY}
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


def warm_start(run: Run) -> str:
  """SFT on the run's worked solutions (resumable); returns the HF dir RL starts from."""
  c = run.cfg
  if c.sft.steps <= 0:
    return run.model_dir
  return sft.train_sft(
    run.model_dir,
    run.data.sft_pairs,
    os.path.join(run.workdir, "sft"),
    learner_cfg=settings.frozen(learner.LearnerConfig, c.sft.learner),
    mesh=run.mesh,
    instruction=c.data.instruction,
    chat_template=c.data.chat_template,
    steps=c.sft.steps,
    batch_size=c.sft.batch_size,
    seed=c.seed,
    checkpoint_every=c.checkpoint.every * 10,
    keep=c.checkpoint.keep,
  )


def make_sampler(run: Run, model_cfg, params, version: int = 0):
  """The configured sampler, serving `params` as `version` (the RL step they follow)."""
  c = run.cfg.sampler
  if c.kind == "jax":
    sampler = JaxSampler(model_cfg, params, run.tokenizer, mesh=run.mesh)
    sampler.version = version
    return sampler
  if c.kind != "vllm":
    raise ValueError(f"sampler.kind: unknown {c.kind!r}; expected jax|vllm")
  from rlvr.sampling.split import ProcessSplitSampler
  from rlvr.sampling.vllm_sampler import VLLMSampler

  if not c.urls:
    raise ValueError("sampler.urls: vllm sampler needs at least one server URL")
  # Multi-host: each process talks to its own servers ("{process}" in a URL is its index;
  # "localhost" is each host's own) and samples its slice of every rollout.
  urls = [u.format(process=jax.process_index()) for u in c.urls]
  client = VLLMSampler(
    urls,
    model_config=model_cfg,
    eos_token_id=run.tokenizer.eos_token_id,
    pad_token_id=run.pad_id,
    sync_dir=os.path.join(run.workdir, "weights"),
    model_name=c.model,
    max_concurrency=c.max_concurrency,
    sync_dtype=jnp.dtype(c.sync_dtype),
    request_timeout_s=c.request_timeout_s,
    retries=c.retries,
    backoff_s=c.backoff_s,
    api_key=c.api_key or None,  # default: $VLLM_API_KEY
    weight_sync=c.weight_sync,  # "disk" or "transfer" (vLLM's weight-transfer API)
    transfer_backend=c.transfer_backend,
    transfer_host=c.transfer_host,
    transfer_bucket_mb=c.transfer_bucket_mb,
  )
  client = ProcessSplitSampler(client) if jax.process_count() > 1 else client
  client.update_weights(params, version=version)
  return client


def evaluate(run: Run, sampler, score_fn, tag: str | None = None) -> dict:
  """pass@k of every eval set; with a tag, also a report under workdir/eval_<tag>."""
  ecfg = settings.frozen(evaluation.EvalConfig, run.cfg.eval.sampling)
  write = tag is not None and distributed.is_writer()
  outdir = os.path.join(run.workdir, f"eval_{tag}") if write else None
  results = {}
  for name, prompts in run.eval_prompts.items():
    samples = (
      os.path.join(outdir, f"samples_{name}.jsonl") if write and run.cfg.eval.samples else None
    )
    results[name] = evaluation.evaluate_set(
      sampler,
      prompts,
      score_fn,
      ecfg,
      progress=tag is not None,
      context=run.context,
      samples_path=samples,
    )
  if write:
    evaluation.write_report(results, outdir, f"eval {tag}")
    for name, r in results.items():  # one line per set, after the progress bars
      k = max(r["pass@k"], key=int)
      skipped = f", {r['skipped_too_long']} too long skipped" if r["skipped_too_long"] else ""
      print(
        f"eval {tag.replace('_', ' ')}: {name} pass@1 {100 * r['pass@k'][1][0]:.1f}% "
        f"(pass@{k} {100 * r['pass@k'][k][0]:.1f}%), {r['problems']} problems{skipped}",
        flush=True,
      )
  return {name: {f"pass@{k}": v[0] for k, v in r["pass@k"].items()} for name, r in results.items()}


def train(run: Run, state, mngr, method, env: loop.StepEnv, eval_score, update, logp_fn, meta=None):
  """RL steps from the restored checkpoint's step (`meta`; None: from 0) to rl.steps;
  checkpoints carry the method's state and are keyed by the RL step, not by the
  optimizer's update count. With rl.loop.max_staleness=1 a checkpoint also keeps the
  buffer built ahead for the next step (`buffer_file`), which a resumed run uses as is.

  SIGINT / SIGTERM end the step in progress, save a checkpoint and exit (`interrupt`).
  """
  from tqdm import tqdm

  c = run.cfg
  start = int(meta["step"]) if meta is not None else 0
  ahead_dir = os.path.join(run.workdir, "checkpoints_ahead")
  rollouts = loop.Rollouts(method, env, overlap=env.sampler.overlaps_update, last_step=c.rl.steps)
  if rollouts.ahead and not rollouts.overlap:
    print(
      "rl.loop.max_staleness=1: the in-process sampler shares the learner's devices, so "
      "each buffer is built one update behind but before that update, not during it "
      "(no overlap; a vLLM sampler overlaps)",
      flush=True,
    )
  if meta is not None and meta.get("ahead_step") is not None:
    rollouts.pending = buffer_file.load(ahead_dir, int(meta["ahead_step"]))
  writer = metrics_lib.MetricsWriter(
    run.workdir,
    resume_step=start,
    enabled=distributed.is_writer(),
    logging=settings.frozen(experiment.LoggingConfig, c.logging, prefix="logging."),
    config=c.to_dict(),
  )
  samples = samples_log.SamplesLog(  # rl.log_samples_every: workdir/samples/step_<k>.jsonl
    run.workdir,
    c.rl.log_samples_every,
    resume_step=start,
    decode=lambda ids: run.tokenizer.decode(list(ids), skip_special_tokens=True),
    show=lambda step, rows: writer.write_table(step, "samples", rows),
    enabled=distributed.is_writer(),
  )
  to_batch = lambda arrays: learner.TrainBatch(**distributed.replicated_batch(arrays, run.mesh))

  def save(step):
    ahead = rollouts.pending
    if ahead is not None and distributed.is_writer():
      buffer_file.save(ahead_dir, ahead)
    extra = {"ahead_step": ahead.step if ahead is not None else None}
    checkpoint.save(mngr, state, {"method": method.state(), "step": step, **extra})
    if distributed.is_writer():
      buffer_file.prune(ahead_dir, mngr.all_steps())

  if start >= c.rl.steps:  # a rerun of a finished run: no bar of the steps done before
    print(f"RL: done before, all {c.rl.steps} steps (checkpoints under {run.workdir})")
  bar = tqdm(
    range(start, c.rl.steps),
    desc=method.name,
    unit="step",
    initial=start,
    total=c.rl.steps,
    disable=start >= c.rl.steps,
  )
  skipped, solved = 0, []
  with interrupt.GracefulStop("RL") as stop:
    try:
      for step in bar:
        state, m = loop.rl_step(
          state, update, method, env, step, to_batch, logp_fn, rollouts, samples
        )
        skipped += m.get("skipped_update", 0)
        solved.append((m.get("solve_all", 0.0), m.get("solve_none", 0.0)))
        if c.eval.every and (step + 1) % c.eval.every == 0:
          for name, scores in evaluate(run, env.sampler, eval_score).items():
            m.update({f"{name}_{k}": v for k, v in scores.items()})
        writer.write(step, m)
        post = {
          "acc": f"{m.get('accuracy', float('nan')):.2f}",
          "ent": f"{m.get('entropy', 0):.2f}",
          "kept": m.get("groups_kept", 0),
        }
        post.update({label: m.get(key, 0) for label, key in method.progress_keys.items()})
        bar.set_postfix(post)
        stopping = stop.agreed()
        if (step + 1) % c.checkpoint.every == 0 or step + 1 == c.rl.steps or stopping:
          save(step + 1)
        if stopping:
          writer.close()
          stop.exit(
            f"after RL step {step + 1} of {c.rl.steps} (checkpoint under {run.workdir}/checkpoints)"
          )
    finally:
      rollouts.close()
  writer.close()
  if start < c.rl.steps and skipped == c.rl.steps - start:
    raise loop.NoSignalError(no_update_message(solved, run.workdir))
  return state


def no_update_message(solved, workdir: str) -> str:
  """The error of an invocation whose every RL step skipped its update; solved: the
  (solve_all, solve_none) of each of its steps."""
  solve_all, solve_none = (sum(x) / len(solved) for x in zip(*solved))
  return (
    f"every one of the {len(solved)} RL steps skipped its update: no group had a learning "
    f"signal (reward variance; solve_all {solve_all:.0%}, solve_none {solve_none:.0%}); "
    f"{loop.no_signal_fix(solve_all, solve_none)}; see {workdir}/metrics.jsonl"
  )


def write_summary(run: Run, method, seconds: float) -> dict:
  """Plots and summary.json from the metrics of all invocations."""
  rows = metrics_lib.read_jsonl(os.path.join(run.workdir, "metrics.jsonl"))
  name = os.path.basename(run.workdir)
  if rows and distributed.is_writer():
    metrics_lib.plot_metrics(
      rows,
      PLOT_KEYS,
      os.path.join(run.workdir, "training.png"),
      title=name,
      before=run.progress.get("eval_before"),
      after=run.progress.get("eval_after"),
    )
    if method.plot_keys:
      mark = method.mark_key
      metrics_lib.plot_metrics(
        rows,
        method.plot_keys,
        os.path.join(run.workdir, f"{method.name}.png"),
        title=f"{name}: {method.name}",
        marks=[r["step"] + 1 for r in rows if mark and r.get(mark)],
      )
  reports = {
    label: os.path.join(run.workdir, f"eval_{tag}", "eval.json")
    for label, tag in (("before RL", "before_rl"), ("after RL", "after_rl"))
  }
  if distributed.is_writer() and all(os.path.exists(p) for p in reports.values()):
    evaluation.plot_comparison(
      {label: _json(p) for label, p in reports.items()},
      os.path.join(run.workdir, "pass_at_k.png"),
      name,
    )
  summary = {
    "steps": run.cfg.rl.steps,
    "eval_before_rl": run.progress["eval_before"],
    "eval_after_rl": run.progress["eval_after"],
    "time_s_this_invocation": round(seconds, 1),
    "method": method.name,
    "model_dir": run.model_dir,
    "workdir": run.workdir,
    **method.summary(rows),
  }
  return _json(os.path.join(run.workdir, "summary.json"), summary)


def _restore_method(method, meta) -> None:
  # Metadata without a "method" entry (an older checkpoint layout) holds only the data position.
  method.restore(meta["method"] if "method" in meta else {"data": meta["data"]})
  print(f"resumed {method.name} from step {meta['step']}")


# ------------------------------------------------------------------------ run
def run(cfg) -> dict:
  """Runs (or resumes) the experiment described by an ml_collections config, holding the
  work dir's lock (`fileio.workdir_lock`): a second run on the same work dir stops at
  once with one line naming the holder's pid and host."""
  t_start = time.time()
  checked = experiment.check(cfg)  # every setting, before anything is built or trained
  distributed.initialize(cfg.get("coordinator") or None)
  workdir = os.path.abspath(cfg.workdir)
  os.makedirs(workdir, exist_ok=True)
  with _workdir_lock(workdir):
    return _run(cfg, checked, t_start)


@contextlib.contextmanager
def _workdir_lock(workdir: str):
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


def _run(cfg, checked, t_start: float) -> dict:
  r = setup(cfg)
  experiment.check_eval_fits(checked.eval.sampling, r.context)
  experiment.check_mesh(checked, dict(r.mesh.shape))
  check_phases(r)
  reward_cfg, lc = checked.reward, checked.rl_learner
  method = methods.make(cfg, r.prompts(r.data.train, "train"))
  with open_verifier(reward_cfg, cfg.reward_workers) as verifier:
    verifier.check_answers(r.data.train, "data.train_path")
    for name, exs in r.data.evals.items():
      verifier.check_answers(exs, f"eval set {name}")
    score, eval_score = verifier.score, verifier.for_eval().judge
    start_dir = warm_start(r)
    model_cfg = model_lib.ModelConfig.from_hf(start_dir)
    mngr, state, meta = checkpoint.restore_or_init(
      os.path.join(r.workdir, "checkpoints"),
      model_cfg,
      lc,
      r.mesh,
      lambda: model_lib.load_hf(start_dir, mesh=r.mesh)[1],
      seed=cfg.seed,
      keep=cfg.checkpoint.keep,
    )
    if meta is not None:
      _restore_method(method, meta)
    sampler = make_sampler(r, model_cfg, state.params, int(meta["step"]) if meta else 0)
    if "eval_before" not in r.progress:
      r.progress["eval_before"] = evaluate(r, sampler, eval_score, "before_rl")
      r.save_progress()
    else:
      print(f"eval before RL: done before, reusing {r.workdir}/progress.json", flush=True)
    env = loop.StepEnv(
      sampler,
      score,
      rl=settings.frozen(loop.RLConfig, cfg.rl.loop),
      pad_id=r.pad_id,
      encode=r.encode,
      encode_task=r.encode_task,
      answer_of=r.data.answer_of,
      shaping_cfg=settings.frozen(shaping.ShapingConfig, cfg.shaping),
      well_formed=verifier.well_formed,
    )
    state = train(
      r,
      state,
      mngr,
      method,
      env,
      eval_score,
      learner.make_update_fn(model_cfg, lc, r.mesh),
      learner.make_logprob_fn(model_cfg, lc, r.mesh),
      meta,
    )
    mngr.close()
    if r.progress.get("eval_after_step") != cfg.rl.steps:
      r.progress["eval_after"] = evaluate(r, sampler, eval_score, "after_rl")
      r.progress["eval_after_step"] = cfg.rl.steps
      r.save_progress()
    if cfg.export_hf:
      checkpoint.export_hf(
        os.path.join(r.workdir, "policy"), model_cfg, state, tokenizer=r.tokenizer
      )
  return write_summary(r, method, time.time() - t_start)
