"""VLLMSampler against a real vLLM CPU server: logprobs, weight sync, faults."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time

import echo_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_run
from paths import REPO

from rlvr import envs, model
from rlvr.sampling import JaxSampler, SamplingParams
from rlvr.sampling.vllm_sampler import (
  EngineDeadError,
  MalformedResponseError,
  RequestAbortedError,
  SamplerError,
  VLLMSampler,
  parse_completion_response,
)
from rlvr.sampling.vllm_server import ServerOptions, free_port, start_server

_WIDTH = 96


@functools.lru_cache
def _logprob_fn(cfg):
  return jax.jit(lambda p, t: jax.nn.log_softmax(model.forward(p, t, config=cfg)[0], axis=-1))


@functools.lru_cache
def _logits_fn(cfg):
  return jax.jit(lambda p, t: model.forward(p, t, config=cfg)[0].astype(jnp.float32))


def _penalized_last_logits(params, cfg, seq, penalty):
  """Our f32 next-token logits after `seq`, with vLLM's repetition penalty on seq's ids."""
  padded = np.zeros((1, _WIDTH), np.int32)
  padded[0, : len(seq)] = seq
  z = np.array(_logits_fn(cfg)(params, jnp.asarray(padded)))[len(seq) - 1]  # writable
  ids = np.asarray(sorted(set(seq)))
  x = z[ids]
  z[ids] = np.where(x > 0, x * (np.float32(1) / np.float32(penalty)), x * np.float32(penalty))
  return z


def _our_logprobs(params, cfg, prompt, completion):
  seq = list(prompt) + list(completion)
  padded = np.zeros((1, _WIDTH), np.int32)
  padded[0, : len(seq)] = seq
  logp = np.asarray(_logprob_fn(cfg)(params, jnp.asarray(padded)))
  pos = np.arange(len(prompt) - 1, len(seq) - 1)
  return logp[pos, list(completion)]


@pytest.fixture(scope="module")
def client(vllm_server, served_model_dir, tmp_path_factory):
  cfg, params = model.load_hf(served_model_dir)
  sampler = VLLMSampler(
    vllm_server.url,
    model_config=cfg,
    eos_token_id=cfg.eos_token_id,
    sync_dir=str(tmp_path_factory.mktemp("sync")),
    model_name=vllm_server.options.served_model_name,
  )
  yield sampler, cfg, params
  sampler.close()


PROMPTS = [[5, 6, 7, 8, 9, 10], [300, 301, 302], list(range(100, 140))]


def _max_diff(outs, prompts, params, cfg):
  worst = 0.0
  for prompt, group in zip(prompts, outs):
    for c in group:
      ours = _our_logprobs(params, cfg, prompt, c.token_ids)
      worst = max(worst, float(np.abs(np.asarray(c.logprobs) - ours).max()))
  return worst


def test_sampled_logprobs_match_ours(client):
  sampler, cfg, params = client
  outs = sampler.generate(
    PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=24, seed=0, ignore_eos=True)
  )
  assert [len(g) for g in outs] == [4, 4, 4]
  assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for g in outs for c in g)
  assert len({c.token_ids for c in outs[0]}) > 1
  assert _max_diff(outs, PROMPTS, params, cfg) <= 1e-3
  again = sampler.generate(
    PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=24, seed=0, ignore_eos=True)
  )
  assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in outs]


def test_episodes_continue_from_their_token_prefix(client, served_model_dir):
  """Multi-turn episodes over the server: each turn is sampled from the prompt + trajectory
  token ids (never re-encoded text), and the episode is those turns' tokens with the
  observations between them; the policy's tokens' logprobs are our model's (1e-3, as
  for single responses above)."""
  from transformers import AutoTokenizer

  sampler, cfg, params = client
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  prompts = [tok.encode("Compute 3+4"), tok.encode("Compute 12+7")]
  turns = echo_env.check_trajectories(sampler, tok, prompts, budget=_WIDTH - 4)
  assert max(turns) > 1
  # Each whole episode scored by our model at once: the policy's tokens carry the
  # sampler's logprobs.
  runner = envs.Episodes(
    echo_env.Echo(None),
    envs.EnvConfig(name="echo_env:make", max_turns=4, max_total_tokens=_WIDTH - 4),
    decode=lambda ids: tok.decode(list(ids), skip_special_tokens=True),
    encode=lambda t: tok(t, add_special_tokens=False)["input_ids"],
  )
  outs = runner.generate(sampler, prompts, SamplingParams(n=2, max_tokens=24, seed=9))
  for prompt, row in zip(prompts, outs):
    for ep in row:
      ours = _our_logprobs(params, cfg, prompt, ep.token_ids)
      mask = np.asarray(ep.loss_mask, bool)
      assert np.abs(np.asarray(ep.logprobs)[mask] - ours[mask]).max() <= 1e-3


def test_weight_sync_serves_new_params_even_for_cached_prefixes(client):
  sampler, cfg, params = client
  sp = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=1, ignore_eos=True)
  before = sampler.generate(PROMPTS, sp)  # fills the prefix cache with the old weights
  assert _max_diff(before, PROMPTS, params, cfg) <= 1e-3
  new = jax.tree.map(lambda p: p + 0.05 * jnp.cos(jnp.arange(p.size).reshape(p.shape)), params)
  try:
    sampler.update_weights(new, version=1)
    after = sampler.generate(PROMPTS, sp)
    assert all(c.weight_version == 1 for g in after for c in g)
    assert _max_diff(after, PROMPTS, new, cfg) <= 1e-3
    assert _max_diff(after, PROMPTS, params, cfg) > 1e-2  # not the old weights
    info = sampler._session().get(sampler.urls[0] + "/weight_info").json()
    assert info["weight_version"] == "1"
  finally:
    sampler.update_weights(params, version=2)  # the session server is shared
  assert _max_diff(sampler.generate(PROMPTS, sp), PROMPTS, params, cfg) <= 1e-3


def test_parse_reports_malformed_responses():
  good = {
    "choices": [
      {
        "index": 0,
        "token_ids": [1, 2],
        "text": "ab",
        "finish_reason": "stop",
        "logprobs": {"token_logprobs": [-0.1, -0.2]},
      }
    ]
  }
  (c,) = parse_completion_response(good, 1, True, set(), 3)
  assert c.token_ids == (1, 2) and c.logprobs == (-0.1, -0.2) and c.weight_version == 3
  cases = {
    "no 'choices'": {"error": "x"},
    "expected 2 choices": good,
    "token_ids missing": {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
    "token_logprobs missing or of length 1": {
      "choices": [dict(good["choices"][0], logprobs={"token_logprobs": [-0.1]})]
    },
    "finish_reason: unexpected": {"choices": [dict(good["choices"][0], finish_reason="eos")]},
  }
  for msg, body in cases.items():
    with pytest.raises(MalformedResponseError, match=msg):
      parse_completion_response(body, 2 if "2 choices" in msg else 1, True, set(), None)
  with pytest.raises(MalformedResponseError, match="no 'choices'"):
    parse_completion_response("<html>502</html>", 1, True, set(), None)
  # What a server shutting down sends for the requests it holds: retried, not malformed.
  aborted = {"choices": [dict(good["choices"][0], finish_reason="abort")]}
  for n in (1, 2):  # also when it comes back with fewer choices than asked for
    with pytest.raises(RequestAbortedError, match=r"choices\[0\]: request aborted"):
      parse_completion_response(aborted, n, True, set(), None)


def test_parse_reads_routed_experts_in_the_samplers_layout():
  """A choice's `routed_experts` (vLLM's capture, as a GPU server started with
  --enable-return-routed-experts sends it: base64 .npy [prompt + completion - 1, all layers,
  k], dense layers zero) becomes Completion.routes: int32 [prompt + completion, sparse
  layers, k], -1 on the last token, as the JAX sampler lays them out."""
  import base64
  import io

  from rlvr.sampling.vllm_server import ServerOptions

  def encode(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return base64.b64encode(buf.getvalue()).decode()

  rng = np.random.default_rng(0)
  fed = rng.integers(0, 6, (4, 4, 3)).astype(np.uint8)  # 3 prompt + 2 completion tokens - 1
  fed[:, 2] = 0  # layer 2 dense
  choice = {"index": 0, "token_ids": [7, 8], "text": "", "finish_reason": "length"}
  body = {"choices": [dict(choice, routed_experts=encode(fed))]}
  (c,) = parse_completion_response(body, 1, False, set(), None, (3, [0, 1, 3], 3))
  assert c.routes.dtype == np.int32 and c.routes.shape == (5, 3, 3)
  np.testing.assert_array_equal(c.routes[:4], fed[:, [0, 1, 3]])
  assert (c.routes[4] == -1).all()
  # Without capture (or for a dense policy) there are no routes; a bad array is named.
  (c,) = parse_completion_response({"choices": [choice]}, 1, False, set(), None, (3, [0], 3))
  assert c.routes is None
  for bad, msg in ((encode(fed[:3]), r"uint8\[3, 4, 3\] for 5 tokens"), ("%%", "not a base64")):
    with pytest.raises(MalformedResponseError, match=r"choices\[0\]\.routed_experts: " + msg):
      parse_completion_response(
        {"choices": [dict(choice, routed_experts=bad)]}, 1, False, set(), None, (3, [0, 1, 3], 3)
      )
  # The server flag: GPU only (vLLM 0.32 captures routes in its Triton model runner).
  gpu = ServerOptions(device="gpu", routed_experts=True)
  assert "--enable-return-routed-experts" in gpu.command("m", 8000, "python")
  assert gpu.env()["VLLM_USE_V2_MODEL_RUNNER"] == "1"
  with pytest.raises(ValueError, match="routed_experts: needs a GPU server"):
    ServerOptions(device="cpu", routed_experts=True)


def _abort_in_flight(sampler, server, sp, tries=20):
  """A future of `sampler.generate` whose request the server aborted (its `/abort_requests`
  route, as a shutdown does). On the CPU build the server's HTTP side barely answers while
  its engine decodes, so aborts are sent from the moment the request is: the first that
  finds it in flight wins; if none does, the request is sent again, up to `tries` times."""
  ex = concurrent.futures.ThreadPoolExecutor(1)
  for _ in range(tries):
    fut = ex.submit(sampler.generate, [[5, 6, 7]], sp)
    while not fut.done():
      if sampler._session().post(server.url + "/abort_requests", json={}).json()["aborted"]:
        ex.shutdown(wait=False)
        return fut
      time.sleep(0.005)
  pytest.fail(f"no abort reached the server while a request was in flight, in {tries} tries")


def test_requests_the_server_aborts_are_retried(client, vllm_server):
  """The server drops what it holds: the client retries within its budget, and names the
  server once it is spent."""
  _, cfg, _ = client
  sp = SamplingParams(n=4, max_tokens=1000, ignore_eos=True)  # the server's max_model_len: 1024
  for retries in (1, 0):
    sampler = VLLMSampler(
      vllm_server.url,
      model_config=cfg,
      eos_token_id=cfg.eos_token_id,
      model_name=vllm_server.options.served_model_name,
      retries=retries,
      backoff_s=0.1,
      request_timeout_s=120,
    )
    try:
      fut = _abort_in_flight(sampler, vllm_server, sp)
      if retries:  # aborted, so these full-length completions come from a second try
        (group,) = fut.result(timeout=120)
        assert [len(c.token_ids) for c in group] == [sp.max_tokens] * 4
      else:
        with pytest.raises(
          RequestAbortedError,
          match=f"vLLM server {vllm_server.url}/v1/completions: request "
          r"aborted by the server in all 1 attempts \(aborted; ",
        ):
          fut.result(timeout=120)
    finally:
      sampler.close()


def test_bad_retry_settings_are_named(client, tmp_path):
  _, cfg, _ = client
  for kw, msg in (
    (dict(retries=-1), "retries: must be an int >= 0, got -1"),
    (dict(retries=1.5), "retries: must be an int >= 0, got 1.5"),
    (dict(retries=True), "retries: must be an int >= 0, got True"),
    (dict(request_timeout_s=0), "request_timeout_s: must be a number > 0, got 0"),
    (dict(request_timeout_s=None), "request_timeout_s: must be a number > 0"),
    (dict(backoff_s=-1.0), "backoff_s: must be a number >= 0, got -1.0"),
  ):
    with pytest.raises(ValueError, match=re.escape(msg)):
      VLLMSampler("http://127.0.0.1:1", model_config=cfg, eos_token_id=0, **kw)
  # In a run: one line naming the config field, before SFT spends any time.
  out = tiny_run.launch(
    tmp_path,
    "--config.sampler.kind=vllm",
    "--config.sampler.urls=http://127.0.0.1:1",
    "--config.sampler.backoff_s=-2.0",
    timeout=300,
  )
  assert out.returncode == 1 and out.stderr.strip().splitlines() == [
    "launch.train: sampler.backoff_s: must be a number >= 0, got -2.0 (--verbose for the traceback)"
  ], out.stderr[-2000:]
  assert not (tmp_path / "sft").exists()


def _long_seeded_batch(sampler, cfg, n_prompts=8, length=300):
  rng = np.random.RandomState(0)
  prompts = [
    [int(t) for t in rng.randint(3, cfg.vocab_size - 70, length)] for _ in range(n_prompts)
  ]
  return sampler.generate(
    prompts, SamplingParams(n=1, temperature=1.0, max_tokens=8, seed=5, ignore_eos=True)
  )


def test_launcher_flags_survive_seeded_long_batches(client):
  """8 x 300 prompt tokens, seeded, batched: the CPU engine crashes when such a prefill
  is chunked; the launcher's token budget (16384) keeps it whole."""
  sampler, cfg, _ = client
  outs = _long_seeded_batch(sampler, cfg)
  assert all(len(g[0].token_ids) == 8 for g in outs)
  assert sampler.health(sampler.urls[0])[0]


@pytest.mark.slow
def test_dead_engine_kill_and_restart(served_model_dir, tmp_path):
  cfg, params = model.load_hf(served_model_dir)
  port = free_port()
  # A server with a small token budget: seeded batched prefills get chunked and its engine dies.
  bad = start_server(
    served_model_dir,
    ServerOptions(port=port, max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=16),
    log_path=str(tmp_path / "bad.log"),
  )
  sampler = VLLMSampler(
    bad.url,
    model_config=cfg,
    eos_token_id=cfg.eos_token_id,
    model_name="policy",
    retries=2,
    backoff_s=0.2,
    request_timeout_s=60,
  )
  try:
    with pytest.raises(EngineDeadError, match=f"{bad.url}.*engine dead"):
      _long_seeded_batch(sampler, cfg)
    assert "CPU Generator does not use offset" in open(bad.log_path).read()
  finally:
    bad.stop()
  # The same URL comes back with the launcher's flags: the client picks it up.
  good = start_server(
    served_model_dir,
    ServerOptions(port=port, max_model_len=1024),
    log_path=str(tmp_path / "good.log"),
  )
  try:
    outs = _long_seeded_batch(sampler, cfg)
    assert all(len(g[0].token_ids) == 8 for g in outs)
    # Killed mid-run: a clear error naming the server once the retry budget is spent
    # (whether the dying server aborted the request or the connection went first).
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
      fut = ex.submit(
        sampler.generate, [[5, 6, 7]] * 4, SamplingParams(n=8, max_tokens=900, ignore_eos=True)
      )
      time.sleep(1.0)
      # SIGKILL: a SIGTERM lets vLLM drain what is in flight, which a fast CPU finishes.
      os.killpg(good.process.pid, signal.SIGKILL)
      good.process.wait()
      with pytest.raises(SamplerError, match=f"vLLM server {good.url}"):
        fut.result(timeout=120)
  finally:
    good.stop()
    sampler.close()


def on_server(server, model_dir) -> list[str]:
  """`launch.train` flags of configs/tiny_rlvr.py on `server`'s model, sampled from it, with
  a short SFT (tests add their own flags after these)."""
  return [
    f"--config.model.path={model_dir}",
    "--config.sampler.kind=vllm",
    f"--config.sampler.urls={server.url}",
    f"--config.sampler.model={server.options.served_model_name}",
    "--config.sampler.sync_dtype=float32",
    "--config.sft.steps=20",
    "--config.sft.batch_size=8",
  ]


@pytest.mark.slow
def test_launch_train_samples_from_the_server_and_syncs_it_every_step(
  client, vllm_server, served_model_dir, tmp_path, check_samples
):
  """`launch.train` with `sampler.kind=vllm` (what every paper config runs): SFT moves the
  policy away from the served weights, the run pushes its weights at start-up and after
  each RL step, and the server ends on the run's final policy (version = rl.steps).
  Then `launch.evaluate --run` samples that policy from the server too."""
  sampler, cfg, served_params = client
  workdir = tmp_path / "run"
  try:
    _, rows = tiny_run.train(
      workdir,
      *on_server(vllm_server, served_model_dir),
      "--config.sampler.retries=1",
      "--config.data.arithmetic.n_sft=64",
      "--config.data.arithmetic.n_train=32",
      "--config.data.arithmetic.n_heldout=8",
      "--config.eval.sampling.n=2",
      "--config.rl.steps=2",
      "--config.rl.loop.prompts_per_step=4",
      "--config.rl.learner.ppo_mini_batch_size=4",
      "--config.rl.loop.dynamic_sampling=False",
      "--config.reward_workers=1",
      "--config.eval.samples=True",
    )
    for tag in ("before_rl", "after_rl"):
      for name, result in json.load(open(workdir / f"eval_{tag}" / "eval.json")).items():
        check_samples(workdir / f"eval_{tag}" / f"samples_{name}.jsonl", result)
    assert [r["step"] for r in rows] == [0, 1] and all(r["tokens_per_s"] > 0 for r in rows)
    info = sampler._session().get(vllm_server.url + "/weight_info").json()
    assert info["weight_version"] == "2"
    # Pushed at start-up (v0) and after each step; the client keeps the newest two.
    assert sorted(os.listdir(workdir / "weights")) == ["v1", "v2"]
    pcfg, policy = model.load_hf(str(workdir / "policy"))
    outs = sampler.generate(PROMPTS, SamplingParams(n=2, max_tokens=8, logprobs=True))
    assert _max_diff(outs, PROMPTS, policy, pcfg) <= 1e-3  # serves the final policy
    assert _max_diff(outs, PROMPTS, served_params, cfg) > 1e-2  # not what it started with
    again = subprocess.run(
      [
        sys.executable,
        "-m",
        "launch.evaluate",
        f"--run={workdir}",
        "--limit=3",
        f"--vllm_urls={vllm_server.url}",
        f"--vllm_model={vllm_server.options.served_model_name}",
        "--reward_workers=1",
      ],
      cwd=REPO,
      env=tiny_run.env(),
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    ((name, result),) = json.load(open(workdir / "eval_again" / "eval.json")).items()
    assert result["problems"] == 3
    check_samples(workdir / "eval_again" / f"samples_{name}.jsonl", result)
  finally:
    sampler.update_weights(served_params, version=2)  # the session server is shared


def _first_difference(a, b):
  return next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_repetition_penalty_greedy_matches_jax_sampler(client):
  """Greedy with and without a strong repetition penalty: the JaxSampler and the vLLM
  server pick the same tokens (a divergence is allowed only at a near-tie of the
  penalized logits, after which the sequences go their own ways), the penalty changes
  the output, and vLLM reproduces that change, including a turn away from a token seen
  only in the prompt (vLLM penalizes prompt | output tokens)."""
  sampler, cfg, params = client
  jax_sampler = JaxSampler(cfg, params, tokenizer=None)
  plain_sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
  base = PROMPTS + [[40, 41]]
  first = jax_sampler.generate(base, plain_sp)
  # Also each prompt extended by its first greedy tokens, whose continuation reuses them.
  prompts = base + [p + list(g[0].token_ids[:4]) for p, g in zip(base, first)]
  outs = {}
  for penalty in (1.0, 2.0):
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=penalty)
    ours = [g[0].token_ids for g in jax_sampler.generate(prompts, sp)]
    theirs = [g[0].token_ids for g in sampler.generate(prompts, sp)]
    agree = []
    for prompt, a, b in zip(prompts, ours, theirs):
      t = _first_difference(a, b)
      if t < len(a):
        z = _penalized_last_logits(params, cfg, list(prompt) + list(a[:t]), penalty)
        assert abs(z[a[t]] - z[b[t]]) < 1e-3, (penalty, prompt, a, b, t, z[a[t]], z[b[t]])
      agree.append(t)
    outs[penalty] = ours, agree
  (plain, _), (pen, agree) = outs[1.0], outs[2.0]
  changed = [
    (prompt, a, _first_difference(a, b))
    for prompt, a, b, n in zip(prompts, plain, pen, agree)
    if a != b and n > _first_difference(a, b)
  ]  # vLLM took the same penalized turn
  assert changed, (plain, pen, agree)
  assert any(a[t] in prompt and a[t] not in a[:t] for prompt, a, t in changed), changed
