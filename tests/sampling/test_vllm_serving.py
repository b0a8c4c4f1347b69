"""A checkpoint written by `save_hf` served by a real vLLM CPU server agrees with our model."""

from __future__ import annotations

import json
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np

from rlvr import model


def _post(url, payload):
  req = urllib.request.Request(
    url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
  )
  with urllib.request.urlopen(req, timeout=120) as r:
    return json.loads(r.read())


def _vllm_prompt_logprobs(server, token_ids):
  """vLLM's logprob of each prompt token given the tokens before it (first is None)."""
  out = _post(
    server.url + "/v1/completions",
    {
      "model": server.options.served_model_name,
      "prompt": token_ids,
      "max_tokens": 1,
      "temperature": 0.0,
      "prompt_logprobs": 0,
    },
  )
  plp = out["choices"][0]["prompt_logprobs"]
  return np.array([entry[str(tok)]["logprob"] for tok, entry in zip(token_ids[1:], plp[1:])])


def test_vllm_prompt_logprobs_match_ours(vllm_server, served_model_dir):
  from transformers import AutoTokenizer

  cfg, params = model.load_hf(served_model_dir)
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  texts = [
    "Compute 12+7*3. First 7*3=21, then 12+21=33. \\boxed{33}",
    "Let x be the number of apples. Find the total.",
    "The answer is 42",
  ]
  prompts = [
    tok.apply_chat_template(
      [{"role": "user", "content": t}], tokenize=True, add_generation_prompt=True
    )
    for t in texts
  ]
  prompts = [
    list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts
  ]
  prompts.append([int(t) for t in np.random.RandomState(0).randint(3, cfg.vocab_size - 70, 200)])
  worst = 0.0
  for ids in prompts:
    theirs = _vllm_prompt_logprobs(vllm_server, ids)
    logits = model.forward(params, jnp.asarray([ids]), config=cfg)[0]
    ours = np.asarray(jax.nn.log_softmax(logits, axis=-1))[np.arange(len(ids) - 1), ids[1:]]
    assert theirs.shape == ours.shape
    worst = max(worst, float(np.abs(theirs - ours).max()))
    np.testing.assert_allclose(theirs, ours, atol=1e-3, rtol=0)
  assert worst < 1e-3
  print(f"max |vLLM - ours| prompt logprob: {worst:.2e}; server start {vllm_server.startup_s:.1f}s")
