"""One SvS step end to end on the tiny model, with JaxSampler and with the vLLM server."""

from __future__ import annotations

import jax
import numpy as np
from transformers import AutoTokenizer

from rlvr import learner, loop, model, sharding, svs_step
from rlvr.data import format_prompt
from rlvr.sampling import JaxSampler
from synthesis import svs


def one_in_three(texts, golds):
  """Rule-based reward that leaves ~1/3 of a random policy's groups underperforming."""
  del golds
  r = np.array([float(len(t) % 3 == 0) for t in texts], np.float32)
  return r, r > 0


RL = loop.RLConfig(prompts_per_step=4, group_size=8, max_prompt_len=16, max_response_len=12)
SVS = svs.SvSConfig(syntheses_per_solution=4)


def _run(sampler, cfg, params, tok):
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  lc = learner.LearnerConfig(learning_rate=1e-3)
  state = learner.init_state(cfg, lc, params, mesh)
  update = learner.make_update_fn(cfg, lc, mesh)
  prompts = [[5 + i, 6 + i, 7 + i, 8 + i] for i in range(16)]
  pos = {"i": 0}

  def draw(k):
    out = list(range(pos["i"], pos["i"] + k))
    pos["i"] += k
    return out

  to_batch = lambda a: learner.TrainBatch(**{k: jax.device_put(v) for k, v in a.items()})
  enc_task = lambda text: format_prompt(tok, text, "")
  enc_problem = lambda text: format_prompt(tok, text, "")
  state, m = svs_step.svs_step(state, update, sampler, draw, prompts, ["0"] * 16, enc_problem,
                               enc_task, one_in_three, RL, SVS, 0, to_batch, tok.pad_token_id)
  return state, m


def _check(state, m):
  assert int(state.step) == 1 or m["skipped_update"] == 1
  assert m["svs_syntheses"] == m["svs_correct_solutions"] * SVS.syntheses_per_solution
  assert (m["svs_accepted"] + m["svs_too_easy"] + m["svs_too_hard"] + m["svs_unparseable"]
          == m["svs_syntheses"])
  assert m["svs_unparseable"] == m["svs_extraction_failures"]
  assert m["svs_underperforming"] >= 1 and m["svs_correct_solutions"] >= 1
  assert m["type1_groups"] >= 1


def test_svs_step_with_jax_sampler_survives_garbage_syntheses(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  state, m = _run(JaxSampler(cfg, params, tok), cfg, params, tok)
  _check(state, m)


def test_svs_step_with_vllm_sampler(vllm_server, served_model_dir, tmp_path):
  from rlvr.sampling.vllm_sampler import VLLMSampler
  cfg, params = model.load_hf(served_model_dir)
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  sampler = VLLMSampler(vllm_server.url, model_config=cfg, eos_token_id=tok.eos_token_id,
                        sync_dir=str(tmp_path / "sync"))
  try:
    state, m = _run(sampler, cfg, params, tok)
    _check(state, m)
    assert sampler.version == 1
  finally:
    sampler.update_weights(params, version=2)
    sampler.close()
