"""A whole RLVR run: model, data, SFT warm start, evaluation, GRPO, summary and plots.

`run(config)` is what `launch/train.py` calls. Every phase writes into the
work dir, and rerunning the same command resumes: a finished SFT phase is
reloaded from `sft/model/`, GRPO from its last orbax checkpoint, with the
data stream continuing in the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp

from rlvr import checkpoint, distributed, evaluation, learner, loop, metrics as metrics_lib
from rlvr import model as model_lib, sharding, svs_step
from rlvr.data import DataStream, format_prompt
from rlvr.rewards import RewardConfig, RewardPool
from rlvr.sampling import JaxSampler
from rlvr.tasks import arithmetic
from synthesis import svs

PLOT_KEYS = ("reward_mean", "accuracy", "entropy", "solve_all", "solve_none",
             "response_len_mean", "truncated_frac", "clip_frac_high", "grad_norm",
             "heldout_pass@1", "heldout_pass@8")
SVS_PLOT_KEYS = ("accuracy", "type1_groups", "type2_groups", "type3_groups", "svs_accepted",
                 "svs_too_easy", "svs_too_hard", "svs_unparseable", "synthetic_accuracy",
                 "svs_accepted_consistent")


def _frozen(cls, d) -> Any:
  """ConfigDict section -> frozen dataclass; unknown fields are named."""
  d = dict(d)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown config fields {unknown}; known: {sorted(names)}")
  for f in dataclasses.fields(cls):
    if f.name in d and isinstance(d[f.name], list):
      d[f.name] = tuple(d[f.name])
  return cls(**d)


def _json(path, obj=None):
  if obj is None:
    with open(path) as f:
      return json.load(f)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)
  return obj


# --------------------------------------------------------------------- pieces
def prepare_model(cfg) -> str:
  """The HF dir to start from: `model.path`, or a cached `make_tiny` build."""
  if cfg.model.path:
    return cfg.model.path
  tiny = dict(cfg.model.tiny)
  key = hashlib.sha1(json.dumps(tiny, sort_keys=True).encode()).hexdigest()[:10]
  path = os.path.join(os.path.expanduser(cfg.model.cache_dir), f"tiny-{key}")
  if not os.path.exists(os.path.join(path, "config.json")):
    tmp = path + f".tmp{os.getpid()}"
    model_lib.make_tiny(tmp, **tiny)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.replace(tmp, path)
  return path


def prepare_data(cfg):
  """(sft_pairs_text, train examples, {eval name: examples})."""
  from rlvr import data as data_lib
  if cfg.data.kind == "arithmetic":
    t = cfg.data.arithmetic
    train, heldout = arithmetic.make_splits(t.n_sft + t.n_train, t.n_heldout, t.difficulty,
                                            cfg.seed, max_operand=t.max_operand)
    sft = [(p.problem, p.solution) for p in train[:t.n_sft]]
    if t.inverse_pairs:
      sft += [arithmetic.inverse_pair(p) for p in train[:t.n_sft]]
    return (sft, arithmetic.to_examples(train[t.n_sft:]),
            {"heldout": arithmetic.to_examples(heldout)})
  d = cfg.data
  if d.kind != "files":
    raise ValueError(f"data.kind: unknown {d.kind!r}; expected arithmetic|files")
  if not d.train_path:
    raise ValueError("data.train_path: required for data.kind='files'")
  read = lambda path: list(data_lib.read_dataset(
      path, problem_field=d.problem_field or None, answer_field=d.answer_field or None,
      on_bad_row=d.on_bad_row))
  train = read(d.train_path)
  evals = {os.path.splitext(os.path.basename(p))[0]: read(p) for p in d.eval_paths}
  sft = []
  if d.sft_path:
    sft = [(e.problem, e.solution) for e in read(d.sft_path) if e.solution]
  return sft, train, evals


def score_fn_for(pool: RewardPool, reward_cfg: RewardConfig):
  def score(texts, golds):
    res = pool.score(texts, golds, reward_cfg)
    return res.rewards, res.correct
  return score


# ------------------------------------------------------------------------ run
def run(cfg) -> dict:
  """Runs (or resumes) the experiment described by an ml_collections config."""
  t_start = time.time()
  distributed.initialize(cfg.get("coordinator") or None)
  workdir = os.path.abspath(cfg.workdir)
  os.makedirs(workdir, exist_ok=True)
  progress_path = os.path.join(workdir, "progress.json")
  progress = _json(progress_path) if os.path.exists(progress_path) else {}
  model_dir = prepare_model(cfg)
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(model_dir)
  pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
  mesh = sharding.make_mesh(dict(cfg.mesh))
  rl_cfg = _frozen(loop.RLConfig, cfg.rl.loop)
  if cfg.method not in ("rlvr", "svs"):
    raise ValueError(f"method: unknown {cfg.method!r}; expected rlvr|svs")
  svs_cfg = _frozen(svs.SvSConfig, cfg.svs)
  # The arithmetic task can recompute a synthetic problem's answer: diagnostic metrics only.
  true_answer = arithmetic.answer_of if cfg.data.kind == "arithmetic" else None
  svs_template = None
  if cfg.svs_template == "arithmetic":
    svs_template = arithmetic.INVERSE_TEMPLATE
  elif cfg.svs_template != "default":
    with open(cfg.svs_template) as f:
      svs_template = f.read()
  reward_cfg = _frozen(RewardConfig, cfg.reward)
  eval_cfg = _frozen(evaluation.EvalConfig, cfg.eval.sampling)
  sft_pairs, train, evals = prepare_data(cfg)
  enc = lambda text: format_prompt(tok, text, cfg.data.instruction)

  def sampler_for(m_cfg, params):
    """The configured sampler, serving `params` (version 0) from the start."""
    if cfg.sampler.kind == "jax":
      return JaxSampler(m_cfg, params, tok, mesh=mesh)
    if cfg.sampler.kind != "vllm":
      raise ValueError(f"sampler.kind: unknown {cfg.sampler.kind!r}; expected jax|vllm")
    from rlvr.sampling.vllm_sampler import VLLMSampler
    if not cfg.sampler.urls:
      raise ValueError("sampler.urls: vllm sampler needs at least one server URL")
    client = VLLMSampler(list(cfg.sampler.urls), model_config=m_cfg,
                         eos_token_id=tok.eos_token_id, pad_token_id=pad_id,
                         sync_dir=os.path.join(workdir, "weights"),
                         max_concurrency=cfg.sampler.max_concurrency,
                         sync_dtype=jnp.dtype(cfg.sampler.sync_dtype))
    client.update_weights(params, version=0)
    return client
  to_batch = lambda arrays: learner.TrainBatch(**distributed.global_batch(arrays, mesh))
  eval_prompts = {name: [enc(e.problem) for e in exs] for name, exs in evals.items()}
  eval_answers = {name: [e.answer for e in exs] for name, exs in evals.items()}

  with RewardPool(workers=cfg.reward_workers, timeout_s=reward_cfg.timeout_s) as pool:
    score = score_fn_for(pool, reward_cfg)
    # Evaluation counts correct answers only, with general (not integer-only) matching.
    eval_score = score_fn_for(pool, dataclasses.replace(reward_cfg, integer_answers=False,
                                                        format_bonus=0.0))

    def run_eval(sampler, tag):
      results = {name: evaluation.evaluate_set(sampler, eval_prompts[name], eval_answers[name],
                                               eval_score, eval_cfg, progress=True)
                 for name in eval_prompts}
      evaluation.write_report(results, os.path.join(workdir, f"eval_{tag}"), f"eval {tag}")
      return {name: {"pass@1": r["pass@k"][1][0], **{f"pass@{k}": v[0] for k, v in
                                                      r["pass@k"].items()}}
              for name, r in results.items()}

    # ---- SFT warm start
    start_dir = model_dir
    if cfg.sft.steps > 0:
      from rlvr import sft as sft_lib
      start_dir = sft_lib.train_sft(
          model_dir, sft_pairs, os.path.join(workdir, "sft"),
          learner_cfg=_frozen(learner.LearnerConfig, cfg.sft.learner), mesh=mesh,
          instruction=cfg.data.instruction, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size,
          seed=cfg.seed, checkpoint_every=cfg.checkpoint.every * 10, keep=cfg.checkpoint.keep)
    m_cfg, params = model_lib.load_hf(start_dir, mesh=mesh)

    if "eval_before" not in progress:
      progress["eval_before"] = run_eval(sampler_for(m_cfg, params), "before_rl")
      _json(progress_path, progress)

    # ---- GRPO
    lc = _frozen(learner.LearnerConfig, cfg.rl.learner)
    mngr = checkpoint.manager(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep)
    prompt_ids = [enc(e.problem) for e in train]
    answers = [e.answer for e in train]
    if mngr.latest_step() is not None:
      state, meta = checkpoint.restore(mngr, checkpoint.abstract_state(m_cfg, lc, mesh))
      stream = DataStream.from_state(meta["data"])
      print(f"resumed GRPO from step {int(state.step)} ({workdir}/checkpoints)")
    else:
      state = learner.init_state(m_cfg, lc, params, mesh, jax.random.PRNGKey(cfg.seed))
      stream = DataStream(len(train), cfg.seed)
    del params
    start = int(jax.device_get(state.step))
    update = learner.make_update_fn(m_cfg, lc, mesh)
    sampler = sampler_for(m_cfg, state.params)
    writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
    from tqdm import tqdm
    bar = tqdm(range(start, cfg.rl.steps), desc="grpo", unit="step", initial=start,
               total=cfg.rl.steps)
    for step in bar:
      if cfg.method == "svs":
        state, m = svs_step.svs_step(
            state, update, sampler, stream.next_indices, prompt_ids, answers, enc,
            lambda text: format_prompt(tok, text, ""), score, rl_cfg, svs_cfg, step, to_batch,
            pad_id, template=svs_template, true_answer=true_answer)
      else:
        state, m = loop.rl_step(state, update, sampler, stream.next_indices, prompt_ids,
                                answers, score, rl_cfg, step, to_batch, pad_id)
      if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
        for name in eval_prompts:
          r = evaluation.evaluate_set(sampler, eval_prompts[name], eval_answers[name],
                                      eval_score, eval_cfg)
          m.update({f"{name}_pass@{k}": v[0] for k, v in r["pass@k"].items()})
      writer.write(step, m)
      post = {"acc": f"{m['accuracy']:.2f}", "ent": f"{m.get('entropy', 0):.2f}",
              "kept": m["groups_kept"]}
      if cfg.method == "svs":
        post["syn"] = m.get("svs_accepted", 0)
      bar.set_postfix(post)
      if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.rl.steps:
        checkpoint.save(mngr, state, {"data": stream.state(), "step": step + 1})
    writer.close()
    mngr.close()

    if "eval_after" not in progress or progress.get("eval_after_step") != cfg.rl.steps:
      progress["eval_after"] = run_eval(sampler, "after_rl")
      progress["eval_after_step"] = cfg.rl.steps
      _json(progress_path, progress)
    if cfg.export_hf:
      checkpoint.export_hf(os.path.join(workdir, "policy"), m_cfg, state, tokenizer=tok)

  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  if rows:
    metrics_lib.plot_metrics(rows, PLOT_KEYS, os.path.join(workdir, "training.png"),
                             title=os.path.basename(workdir))
    if cfg.method == "svs":
      metrics_lib.plot_metrics(rows, SVS_PLOT_KEYS, os.path.join(workdir, "svs.png"),
                               title=f"{os.path.basename(workdir)}: SvS buffer")
  summary = {
      "steps": cfg.rl.steps,
      "eval_before_rl": progress["eval_before"],
      "eval_after_rl": progress["eval_after"],
      "time_s_this_invocation": round(time.time() - t_start, 1),
      "method": cfg.method,
      "model_dir": model_dir,
      "workdir": workdir,
  }
  if cfg.method == "svs" and rows:
    summary["synthetic_accepted_per_step"] = [r.get("svs_accepted", 0) for r in rows]
    summary["synthetic_accepted_mean"] = round(
        sum(summary["synthetic_accepted_per_step"]) / len(rows), 2)
    if "svs_accepted_consistent" in rows[-1]:
      summary["accepted_consistent_per_step"] = [r.get("svs_accepted_consistent", 0)
                                                 for r in rows]
    summary["buffer_types_per_step"] = [
        [r.get("type1_groups", 0), r.get("type2_groups", 0), r.get("type3_groups", 0)]
        for r in rows]
  _json(os.path.join(workdir, "summary.json"), summary)
  return summary
