"""Multi-turn episodes (`rlvr.envs`): a trajectory is the sampler's tokens plus the
observations, token for token; observations are outside the loss; the python tool runs
each block in the sandbox, and no block ends more than its own call."""

from __future__ import annotations

import dataclasses

import echo_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from echo_env import Echo
from rules import even_length
from step_context import step_context
from transformers import AutoTokenizer

from rlvr import envs, learner, model, objectives, rollout
from rlvr.envs.python_tool import PythonTool, last_block
from rlvr.learner import packing
from rlvr.methods import composition, plain
from rlvr.methods import qbq as qbq_method
from rlvr.methods import svs as svs_method
from rlvr.parallel import sharding
from rlvr.rollout import Prompt, RLConfig
from rlvr.sampling import JaxSampler, SamplingParams
from synthesis import svs
from synthesis.composition import CurriculumConfig

RL = RLConfig(prompts_per_step=4, group_size=2, max_prompt_len=16, max_response_len=24)
ENV = envs.EnvConfig(name="echo_env:make", max_turns=4, max_total_tokens=120)


@pytest.fixture(scope="module")
def policy(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  return cfg, params, tok, JaxSampler(cfg, params, tok)


def _episodes(tok, env=None, cfg=ENV):
  return envs.Episodes(
    env or Echo(cfg),
    cfg,
    decode=lambda ids: tok.decode(list(ids), skip_special_tokens=True),
    encode=lambda text: tok(text, add_special_tokens=False)["input_ids"],
  )


def _prompts(tok, k=4):
  return [Prompt(tuple(tok.encode(f"Compute {i}+{2 * i}")), "0", f"{i}+{2 * i}") for i in range(k)]


def test_a_trajectory_is_the_samplers_tokens_and_the_observations(policy):
  _, _, tok, sampler = policy
  turns = echo_env.check_trajectories(sampler, tok, [list(p.ids) for p in _prompts(tok)])
  assert max(turns) > 1  # several episodes of several turns


def test_the_budgets_end_episodes_as_truncated(policy):
  _, _, tok, sampler = policy
  prompts = [list(p.ids) for p in _prompts(tok)]
  sp = SamplingParams(n=2, max_tokens=24, seed=3)
  cut = len(tok(envs.episodes.TRUNCATED, add_special_tokens=False)["input_ids"])
  assert (
    len(tok(" [observation 1 of the echo environment] ", add_special_tokens=False)["input_ids"])
    > cut + 1
  )
  for cfg, key, most in (
    (dataclasses.replace(ENV, max_turns=2), "budget_turns", None),
    (dataclasses.replace(ENV, max_total_tokens=30), "budget_tokens", 30),
    (dataclasses.replace(ENV, observation_max_tokens=cut + 1), "observation_cut", None),
  ):
    eps = [c for row in _episodes(tok, cfg=cfg).generate(sampler, prompts, sp) for c in row]
    assert any(c.info.get(key) for c in eps), key
    for c in eps:
      assert c.info["turns"] <= cfg.max_turns
      if key != "observation_cut" and c.info.get(key):
        assert c.finish_reason == "length"
      if most is not None:
        assert len(prompts[0]) + len(c.token_ids) <= most + 24  # prompts differ by a few


@pytest.fixture(scope="module")
def episode_groups(policy):
  """Scored groups of Echo episodes, as a method's rollout makes them."""
  _, _, tok, sampler = policy
  ctx = step_context(sampler, even_length, tok, rl=RL, episodes=_episodes(tok))
  return ctx.groups(_prompts(tok), RL.sampling_params(seed=7))


def test_observations_are_outside_the_loss(policy, episode_groups, one_device_learner):
  """The learner's log-probs equal the sampler's on the policy's tokens (1e-4); the loss
  counts only those tokens; whatever the observations' sampler log-probs hold, the update
  is the same bit for bit; the loss's gradient at observation positions is exactly 0."""
  cfg, params, tok, _ = policy
  groups = episode_groups
  comps = [c for g in groups for c in g.completions]
  assert any(0 in c.loss_mask for c in comps)
  plain = learner.LearnerConfig()
  for lc in (plain, dataclasses.replace(plain, pack=True, pack_len=128, pack_min_rows=1)):
    arrays = packing.build_batch(groups, lc, RL.batch_shape, tok.pad_token_id)
    assert arrays["loss_mask_bt"].sum() == sum(c.policy_tokens for c in comps)
  arrays = packing.build_batch(groups, plain, RL.batch_shape, tok.pad_token_id)
  mask = arrays["loss_mask_bt"] > 0
  batch = learner.TrainBatch(**{k: jnp.asarray(v) for k, v in arrays.items()})
  ours = np.asarray(learner.make_logprob_fn(cfg, learner.LearnerConfig())(params, batch))
  np.testing.assert_allclose(ours[mask], arrays["sampler_logp_bt"][mask], atol=1e-4)

  observation = (arrays["segment_bt"] > 0) & ~mask
  observation[:, : RL.max_prompt_len] = False  # prompts
  noisy = dict(arrays, sampler_logp_bt=np.where(observation, -7.5, arrays["sampler_logp_bt"]))
  results = []
  for a in (arrays, noisy):
    lrn = one_device_learner(cfg, params, 1e-2, tis_cap=2.0, kl_beta=0.1)
    state, m = lrn.update_fn(lrn.state, lrn.to_batch(a))
    results.append((jax.tree.leaves(jax.device_get(state.params)), m))
  (p_a, m_a), (p_b, m_b) = results
  assert float(m_a["tokens"]) == mask.sum()
  for x, y in zip(p_a, p_b):
    assert np.array_equal(x, y)

  adv, m = jnp.asarray(arrays["advantages"]), jnp.asarray(mask)
  seqs = None  # one sequence per row

  def loss(logp, aggregation, name):
    norm = objectives.loss_normalizer(m, aggregation, seqs)
    old = jax.lax.stop_gradient(logp) - 0.1
    value, _ = objectives.policy_loss(
      logp, old, adv, m, aggregation=aggregation, normalizer=norm, sequences_bt=seqs, loss=name
    )
    kl = objectives.kl_penalty(logp, jnp.zeros_like(logp), "k3")
    return value + objectives.aggregate(kl, m, aggregation, norm, seqs)

  for aggregation in objectives.AGGREGATIONS:
    for name in objectives.POLICY_LOSSES:
      grad = np.asarray(jax.grad(loss)(jnp.asarray(ours), aggregation, name))
      assert np.all(grad[observation] == 0.0), (aggregation, name)
      assert np.any(grad[mask] != 0.0), (aggregation, name)


def test_episodes_packed_split_and_sharded_make_the_same_update(policy, episode_groups):
  """One sequence per row on one device, packed rows in two micro-batches, and a
  data x fsdp mesh: the same step on interleaved masks (rtol 1e-4)."""
  cfg, params, tok, _ = policy
  one_per_row = learner.LearnerConfig()
  packed_lc = dataclasses.replace(one_per_row, pack=True, pack_len=256, pack_min_rows=2)
  plain, packed = (
    packing.build_batch(episode_groups, lc, RL.batch_shape, tok.pad_token_id)
    for lc in (one_per_row, packed_lc)
  )
  assert (
    packed["segment_bt"].max() > 1 and packed["loss_mask_bt"].sum() == plain["loss_mask_bt"].sum()
  )
  results = []
  for arrays, micro, axes, devices in (
    (plain, 1, {"fsdp": 1}, jax.devices()[:1]),
    (packed, 2, {"fsdp": 1}, jax.devices()[:1]),
    (plain, 2, {"data": 2, "fsdp": 2}, jax.devices()[:4]),
  ):
    mesh = sharding.make_mesh(axes, devices)
    lc = learner.LearnerConfig(learning_rate=1e-3, micro_batches=micro, tis_cap=2.0)
    batch = learner.TrainBatch(
      **{k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in arrays.items()}
    )
    state, m = learner.make_update_fn(cfg, lc, mesh)(
      learner.init_state(cfg, lc, params, mesh), batch
    )
    metrics = (float(m["loss"]), float(m["grad_norm"]), float(m["tokens"]))
    results.append((jax.tree.leaves(jax.device_get(state.params)), metrics))
  (p0, m0), *rest = results
  for p, m in rest:
    assert m == pytest.approx(m0, rel=1e-4, abs=1e-6)
    # Adam's first step moves a weight by about lr whatever its gradient's size, so the
    # summation order shows on the few weights whose gradient is about 0: all within 2 lr,
    # and all but one in a thousand to 1e-6.
    diff = np.concatenate([np.abs(a - b).ravel() for a, b in zip(p0, p)])
    assert diff.max() <= 2e-3 and np.mean(diff > 1e-6) < 1e-3


def _method(name, prompts, workdir):
  if name == "rlvr":
    return plain.Plain(prompts, 0)
  if name == "svs":
    cfg = svs.SvSConfig(syntheses_per_solution=2)
    return svs_method.SvS(prompts, 0, cfg, template="Write a problem this solves: {solution}")
  if name == "composition":
    return composition.Composition(prompts, CurriculumConfig(depths=(1,)), seed=0)
  cfg = qbq_method.QbQConfig(
    rounds=1,
    steps_per_round=1,
    k=4,
    seed_band="mixed",
    initial_seeds=4,
    select_n=4,
    teacher="procedural",
    score_max_tokens=12,
  )
  return qbq_method.QbQ(cfg, prompts, str(workdir), 0)


@pytest.mark.parametrize("name", ["rlvr", "svs", "composition", "qbq"])
def test_every_method_steps_in_an_environment(policy, one_device_learner, name, tmp_path):
  """A method has no code for environments: its rollouts are episodes, and the step trains
  on them and reports them."""
  cfg, params, tok, sampler = policy
  enc = lambda text: tok.encode(text)
  rl = RLConfig(prompts_per_step=4, group_size=4, max_prompt_len=256, max_response_len=12)
  ctx = step_context(sampler, even_length, tok, rl=rl, encode=enc, episodes=_episodes(tok))
  texts = [f"Compute {i}+{i + 3}." for i in range(24)]
  prompts = [Prompt(tuple(enc(t)), str(2 * i + 3), t, "composed-d1") for i, t in enumerate(texts)]
  lrn = one_device_learner(cfg, params, 1e-3, rl=rl, pad_id=tok.pad_token_id)
  m = rollout.rl_step(lrn, _method(name, prompts, tmp_path), ctx, 0)
  assert m["turns_mean"] > 1 and m["obs_tokens_frac"] > 0, m


def test_a_python_block_is_found_and_only_a_closed_one():
  turn = "so\n```python\nx = 3\nprint(x * 7)\n```\n```output"
  assert last_block(turn) == "x = 3\nprint(x * 7)\n"
  two = "```python\nprint(1)\n```\n```output\n1\n```\nagain\n```python\nprint(2)\n```\n```output"
  assert last_block(two) == "print(2)\n"
  assert last_block("no code here\n```output") is None


def test_hostile_tool_calls_end_as_observations_and_the_next_call_runs():
  """Fails (never skips) where bubblewrap is missing: `PythonTool` checks the sandbox."""
  cfg = envs.EnvConfig(
    name="python_tool",
    tool_limits=dataclasses.replace(envs.TOOL_LIMITS, wall_s=2.0, cpu_s=1.0, output_bytes=4096),
  )
  tool = PythonTool(cfg)

  def call(code):
    ep = envs.Episode("")
    obs = tool.observe(ep, f"Let me run it.\n```python\n{code}\n```\n```output")
    return obs, ep

  obs, ep = call("print(4821 * 377)")
  assert obs == "\n1817517\n```\n" and ep.tool_calls == 1 and ep.info["tool_time_s"] > 0
  obs, ep = call("print('partial')\n1 / 0")
  assert obs == "\npartial\nruntime_error: ZeroDivisionError: division by zero\n```\n"
  assert ep.info["tool_error_runtime_error"] == 1
  obs, ep = call("while True:\n  pass")
  assert obs.startswith("\ntimeout") and ep.info["tool_error_timeout"] == 1
  obs, ep = call("import os\nwhile True:\n  os.fork()")
  assert obs.endswith("\n```\n") and any(k.startswith("tool_error_") for k in ep.info)
  obs, ep = call("print('x' * 10**7)")
  assert "output_limit" in obs and len(obs) < 400
  obs, ep = call("open('/etc/passwd', 'a').write('pwned')")
  assert "runtime_error" in obs
  obs, ep = tool.observe(envs.Episode(""), "nothing to run\n```output"), None
  assert obs == "\nno python block to run\n```\n"
  obs, ep = call("print(sum(range(10)))")  # the tool still serves
  assert obs == "\n45\n```\n"


def test_an_unknown_environment_is_one_line():
  with pytest.raises(
    ValueError, match=r"^env.name: unknown 'tools'; known: \['python_tool', 'single_turn'\]"
  ):
    envs.make(envs.EnvConfig(name="tools"))
  with pytest.raises(ValueError, match="^env.name: 'rules:even_length' raised TypeError: "):
    envs.make(envs.EnvConfig(name="rules:even_length"))
  with pytest.raises(
    ValueError, match="^env.name: 'echo_env:noop' made a EnvConfig, which is not an Environment"
  ):
    envs.make(envs.EnvConfig(name="echo_env:noop"))
