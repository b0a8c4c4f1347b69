"""One SvS step (rlvr.methods.svs through rollout.rl_step) on the tiny model, with
JaxSampler and with the vLLM server."""

from __future__ import annotations

import dataclasses

import numpy as np
from step_context import step_context
from transformers import AutoTokenizer

from rlvr import model, rollout
from rlvr.data.prompts import format_prompt
from rlvr.data.tasks import arithmetic
from rlvr.methods import svs as svs_method
from rlvr.report import metrics, samples_log
from rlvr.sampling import JaxSampler
from synthesis import svs


def one_in_three(texts, golds, prompts=None):
  """Rule-based reward that leaves ~1/3 of a random policy's groups underperforming."""
  del golds, prompts
  r = np.array([float(len(t) % 3 == 0) for t in texts], np.float32)
  return r, r > 0


# Synthesis prompts carry our whole template plus a solution: 256 tokens hold them.
RL = rollout.RLConfig(prompts_per_step=4, group_size=8, max_prompt_len=256, max_response_len=12)
SVS = svs.SvSConfig(syntheses_per_solution=4)


def _step(make_learner, sampler, cfg, params, tok, prompts, score_fn, rl, svs_cfg, lr, **kw):
  """One rl_step of the SvS method over `prompts` (drawn in a seeded shuffle)."""
  lrn = make_learner(cfg, params, lr, rl=rl, pad_id=tok.pad_token_id, **kw.pop("learner", {}))
  enc = lambda text: format_prompt(tok, text, "")
  ctx = step_context(sampler, score_fn, tok, rl=rl, encode=enc, **kw.pop("ctx", {}))
  samples = kw.pop("samples", None)
  method = svs_method.SvS(prompts, 0, svs_cfg, **kw)
  m = rollout.rl_step(lrn, method, ctx, 0, samples=samples)
  return lrn.state, m


def _run(make_learner, sampler, cfg, params, tok, **kw):
  prompts = [rollout.Prompt((5 + i, 6 + i, 7 + i, 8 + i), "0") for i in range(16)]
  return _step(make_learner, sampler, cfg, params, tok, prompts, one_in_three, RL, SVS, 1e-3, **kw)


def test_authors_loop_samples_originals_once_and_drops_too_long_synthesis_prompts(
  tiny_dirs, one_device_learner
):
  """refill_originals=False: exactly prompts_per_step originals, one round; synthesis
  prompts longer than max_prompt_len are dropped and counted, never cut."""
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  prompts = [rollout.Prompt((5 + i, 6 + i, 7 + i, 8 + i), "0") for i in range(16)]
  short = dataclasses.replace(RL, max_prompt_len=16)
  state, m = _step(
    one_device_learner,
    JaxSampler(cfg, params, tok),
    cfg,
    params,
    tok,
    prompts,
    one_in_three,
    short,
    dataclasses.replace(SVS, refill_originals=False),
    1e-3,
  )
  assert m["prompts_sampled"] == short.prompts_per_step and m["sample_rounds"] == 1
  assert m["svs_underperforming"] >= 1
  assert m["svs_synthesis_too_long"] >= 1 and m["svs_syntheses"] == 0
  assert m["type2_groups"] == m["type3_groups"] == 0


def test_default_synthesis_prompt_does_not_ask_to_hide_the_answer():
  """The authors' prompt has no hiding instruction: the naive-reward ablation exists to show
  the answer leak that only the shaped reward prevents."""
  text = svs.build_synthesis_prompt("7*3=21. 12+21=33. \\boxed{33}").lower()
  assert "reveal" not in text and "hint" not in text and "33" in text


def _check(state, m, svs_cfg=SVS):
  assert int(state.step) == 1 or m["skipped_update"] == 1
  assert m["svs_syntheses"] == m["svs_correct_solutions"] * svs_cfg.syntheses_per_solution
  assert (
    m["svs_accepted"] + m["svs_too_easy"] + m["svs_too_hard"] + m["svs_unparseable"]
    == m["svs_syntheses"]
  )
  assert m["svs_unparseable"] == m["svs_extraction_failures"] + m["svs_synthetic_too_long"]
  assert m["svs_underperforming"] >= 1 and m["svs_correct_solutions"] >= 1
  assert m["type1_groups"] >= 1


def _check_samples(workdir: str, m):
  """The step's samples file: each sampled original, then the update's synthesis and
  synthetic groups, every group with its data type."""
  rows = metrics.read_jsonl(samples_log.path(workdir, 0))
  groups = {r["group"]: (r["tags"]["data_type"], r["kept"]) for r in rows}
  order = ("original", "synthesis", "synthetic")
  types = [t for t, _ in groups.values()]
  assert types == sorted(types, key=order.index) and types.count("original") == m["prompts_sampled"]
  kept = [t for t, k in groups.values() if k]
  assert [kept.count(t) for t in order] == [m[f"type{i}_groups"] for i in (1, 2, 3)]
  assert len(kept) == len(groups) - m["prompts_sampled"] + m["type1_groups"]


def test_svs_step_with_jax_sampler_survives_garbage_syntheses(
  tiny_dirs, one_device_learner, tmp_path
):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  log = samples_log.SamplesLog(str(tmp_path), 1)
  state, m = _run(one_device_learner, JaxSampler(cfg, params, tok), cfg, params, tok, samples=log)
  _check(state, m)
  _check_samples(str(tmp_path), m)


def test_svs_step_with_vllm_sampler(vllm_server, served_model_dir, tmp_path, one_device_learner):
  from rlvr.sampling.vllm_sampler import VLLMSampler

  cfg, params = model.load_hf(served_model_dir)
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  sampler = VLLMSampler(
    vllm_server.url,
    model_config=cfg,
    eos_token_id=tok.eos_token_id,
    sync_dir=str(tmp_path / "sync"),
  )
  try:
    state, m = _run(one_device_learner, sampler, cfg, params, tok)
    _check(state, m)
    assert sampler.version == 1
  finally:
    sampler.update_weights(params, version=2)
    sampler.close()


ARITH_RL = rollout.RLConfig(
  prompts_per_step=32, group_size=8, max_prompt_len=64, max_response_len=40, seed=3
)
ARITH_SVS = svs.SvSConfig(syntheses_per_solution=8)  # the paper's G_v


def _arithmetic_step(
  make_learner, sampler, cfg, params, tok, problems, score_fn, rl=ARITH_RL, samples=None
):
  enc = lambda text: format_prompt(tok, text, "")
  prompts = [rollout.Prompt(tuple(enc(p.problem)), p.answer, p.problem) for p in problems]
  return _step(
    make_learner,
    sampler,
    cfg,
    params,
    tok,
    prompts,
    score_fn,
    rl,
    ARITH_SVS,
    1e-4,
    template=arithmetic.INVERSE_TEMPLATE,
    ctx={"answer_of": arithmetic.answer_of},
    samples=samples,
    # A few hundred groups: micro-batches of 64 rows keep the update near 2 GiB (one pass
    # over them all peaks near 10 GiB on CPU).
    learner={"micro_batch_rows": 64},
  )


def _check_all_types(state, m):
  _check(state, m, ARITH_SVS)
  assert m["skipped_update"] == 0 and int(state.step) == 1
  assert m["type1_groups"] >= 1 and m["type2_groups"] >= 1 and m["type3_groups"] >= 1, m
  # Type 3 groups are exactly the mixed synthetic-solving groups, so each one is a
  # synthetic problem some but not all responses solved.
  assert m["svs_syntheses"] - m["svs_unparseable"] >= m["type3_groups"]
  assert 0 <= m["svs_accepted_consistent"] <= min(m["svs_accepted"], m["svs_consistent"])


def test_svs_step_with_jax_sampler_builds_all_three_types(
  arithmetic_policy, arithmetic_score, one_device_learner, tmp_path
):
  policy_dir, problems = arithmetic_policy
  cfg, params = model.load_hf(policy_dir)
  tok = AutoTokenizer.from_pretrained(policy_dir)
  calls = []

  def recording_score(texts, golds, prompts=None):  # the real scorer; records what it was asked
    rewards, correct = arithmetic_score(texts, golds)
    calls.append((list(golds), np.asarray(correct)))
    return rewards, correct

  # 16 originals a round: the SFT'd policy still leaves types 1, 2 and 3 a dozen groups each.
  rl = dataclasses.replace(ARITH_RL, prompts_per_step=16)
  sampler = JaxSampler(cfg, params, tok)
  log = samples_log.SamplesLog(str(tmp_path), 1)
  state, m = _arithmetic_step(
    one_device_learner, sampler, cfg, params, tok, problems, recording_score, rl, log
  )
  _check_all_types(state, m)
  _check_samples(str(tmp_path), m)
  # Scoring calls: the originals (one per dynamic-sampling round), then the synthetic
  # problems, whose responses are scored against the answer of the ORIGINAL problem each
  # synthesis came from, i.e. of an underperforming one (1..4 of 8 correct).
  assert len(calls) == m["sample_rounds"] + 1
  *originals, (syn_golds, _) = calls
  g = ARITH_RL.group_size
  under_answers = set()
  for golds, correct in originals:
    per_problem = correct.reshape(-1, g).sum(axis=1)
    under_answers |= {golds[i * g] for i, k in enumerate(per_problem) if 1 <= k <= 4}
  assert len(syn_golds) == (m["svs_syntheses"] - m["svs_unparseable"]) * g
  assert set(syn_golds) <= under_answers


def test_svs_step_with_vllm_sampler_builds_all_three_types(
  arithmetic_policy, arithmetic_score, vllm_server, one_device_learner, served_model_dir, tmp_path
):
  from rlvr.sampling.vllm_sampler import VLLMSampler

  policy_dir, problems = arithmetic_policy
  cfg, params = model.load_hf(policy_dir)
  tok = AutoTokenizer.from_pretrained(policy_dir)
  sampler = VLLMSampler(
    vllm_server.url,
    model_config=cfg,
    eos_token_id=tok.eos_token_id,
    sync_dir=str(tmp_path / "sync"),
  )
  try:
    sampler.update_weights(params, version=0)  # the server now serves the SFT policy
    state, m = _arithmetic_step(
      one_device_learner, sampler, cfg, params, tok, problems, arithmetic_score
    )
    _check_all_types(state, m)
  finally:  # leave the shared server serving its own (untied) model again
    sampler.close()
    served_cfg, served = model.load_hf(served_model_dir)
    restore = VLLMSampler(
      vllm_server.url,
      model_config=served_cfg,
      eos_token_id=tok.eos_token_id,
      sync_dir=str(tmp_path / "sync"),
    )
    restore.update_weights(served, version=3)
    restore.close()
