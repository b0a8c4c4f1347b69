"""The methods seam: plain GRPO, SvS and Composition-RL through `rollout.rl_step` (exact
repeats, SvS's bookkeeping, the depth curriculum), and a method defined outside the
library runs through the runner and resumes with its own state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rules import even_length
from step_context import step_context
from transformers import AutoTokenizer

from rlvr import methods, model, rollout
from rlvr.data.prompts import format_prompt
from rlvr.methods import composition, plain
from rlvr.methods import svs as svs_method
from rlvr.sampling import JaxSampler
from synthesis import svs
from synthesis.composition import CurriculumConfig


def one_in_three(texts, golds, prompts=None):
  del golds, prompts
  r = np.array([float(len(t) % 3 == 0) for t in texts], np.float32)
  return r, r > 0


class Sequential:
  """Prompts in list order, cycling (the order the recorded run drew them in)."""

  def __init__(self, prompts):
    self.prompts, self.i = prompts, 0

  def draw(self, k):
    out = [self.prompts[(self.i + j) % len(self.prompts)] for j in range(k)]
    self.i += k
    return out


def run_steps(make_learner, model_dir, method, rl, score_fn, steps=3, lr=1e-3, answer_of=None):
  cfg, params = model.load_hf(model_dir)
  tok = AutoTokenizer.from_pretrained(model_dir)
  lrn = make_learner(cfg, params, lr, rl=rl, pad_id=tok.pad_token_id)
  enc = lambda text: format_prompt(tok, text, "")
  ctx = step_context(
    JaxSampler(cfg, params, tok), score_fn, tok, rl=rl, encode=enc, answer_of=answer_of
  )
  return [rollout.rl_step(lrn, method, ctx, step) for step in range(steps)]


def _untimed(rows):
  return [
    {k: v for k, v in r.items() if not k.startswith("time") and k != "tokens_per_s"} for r in rows
  ]


def _prompts(n, length):
  return [rollout.Prompt(tuple(range(5 + i, 5 + i + length)), "0") for i in range(n)]


def test_plain_grpo_steps_repeat_exactly(tiny_dirs, one_device_learner):
  """Same seed, same machine: the same metrics to the last bit (what exact resume relies on);
  every step updates, on the groups that dynamic sampling kept."""
  rl = rollout.RLConfig(
    prompts_per_step=4, group_size=4, max_prompt_len=8, max_response_len=8, max_extra_rounds=2
  )
  runs = []
  for _ in range(2):
    method = plain.Plain(_prompts(64, 3), seed=0)
    method.pool = Sequential(method.pool.prompts)
    runs.append(
      _untimed(run_steps(one_device_learner, tiny_dirs["qwen2"], method, rl, even_length))
    )
  assert runs[0] == runs[1]
  for r in runs[0]:
    assert r["skipped_update"] == 0 and r["optimizer_steps"] == 1
    assert 0 < r["groups_kept"] <= 4 and 0.0 < r["accuracy"] < 1.0
    assert r["solve_all"] + r["solve_none"] < 1.0  # a kept group is mixed


def test_svs_step_counts_add_up(tiny_dirs, one_device_learner):
  """SvS's bookkeeping on a random policy: every synthesis is accepted or rejected for one
  named reason; type-2 groups come from correct solutions, type-3 from parsed problems."""
  rl = rollout.RLConfig(prompts_per_step=4, group_size=8, max_prompt_len=256, max_response_len=12)
  method = svs_method.SvS(
    _prompts(64, 4),
    0,
    svs.SvSConfig(syntheses_per_solution=4),
    template="Write a problem whose answer this solves: {solution}",
  )
  method.pool = Sequential(method.pool.prompts)
  rows = run_steps(one_device_learner, tiny_dirs["qwen2"], method, rl, one_in_three)
  for r in rows:
    assert r["svs_syntheses"] == 4 * r["svs_correct_solutions"]
    assert r["svs_syntheses"] == (
      r["svs_accepted"] + r["svs_too_easy"] + r["svs_too_hard"] + r["svs_unparseable"]
    )
    assert r["svs_unparseable"] >= r["svs_extraction_failures"] + r["svs_synthetic_too_long"]
    assert r["type2_groups"] <= r["svs_correct_solutions"] and r["type1_groups"] <= 4
    assert r["type3_groups"] <= r["svs_syntheses"] - r["svs_unparseable"]


def test_svs_on_a_policy_that_synthesizes(arithmetic_policy, arithmetic_score, one_device_learner):
  """All three data types (the SFT'd arithmetic policy, real math-verify) in one step."""
  from rlvr.data.tasks import arithmetic

  policy_dir, problems = arithmetic_policy
  tok = AutoTokenizer.from_pretrained(policy_dir)
  enc = lambda text: format_prompt(tok, text, "")
  rl = rollout.RLConfig(
    prompts_per_step=16, group_size=8, max_prompt_len=64, max_response_len=40, seed=3
  )  # 16 originals a round leave each data type ten or more groups
  method = svs_method.SvS(
    [rollout.Prompt(tuple(enc(p.problem)), p.answer, p.problem) for p in problems],
    0,
    svs.SvSConfig(syntheses_per_solution=8),
    template=arithmetic.INVERSE_TEMPLATE,
  )
  method.pool = Sequential(method.pool.prompts)
  rows = run_steps(
    one_device_learner,
    policy_dir,
    method,
    rl,
    arithmetic_score,
    steps=1,
    lr=1e-4,
    answer_of=arithmetic.answer_of,
  )
  for r in rows:
    assert r["type2_groups"] and r["type3_groups"] and r["skipped_update"] == 0
    assert r["svs_accepted_consistent"] <= r["svs_accepted"]
    assert r["groups_kept"] == r["type1_groups"]  # the originals' mixed groups


def test_composition_trains_depth_by_depth_and_resumes_at_the_same_depth(
  tiny_dirs, one_device_learner
):
  """The curriculum draws only the current depth's prompts, switches where its rule says
  (here: after 2 steps) and carries the stage in the method state."""
  drawn = []

  def score(texts, golds, prompts=None):
    drawn.append(set(golds))
    return even_length(texts, golds)

  train = [
    rollout.Prompt(tuple(range(5 + i, 8 + i)), f"d{d}", source=f"composed-d{d}")
    for d in (1, 2)
    for i in range(0, 60, 3)
  ]
  cur = CurriculumConfig(depths=(1, 2), max_steps=2)
  method = composition.Composition(train, cur, seed=0)
  rl = rollout.RLConfig(
    prompts_per_step=4, group_size=4, max_prompt_len=8, max_response_len=8, max_extra_rounds=3
  )
  rows = run_steps(one_device_learner, tiny_dirs["qwen2"], method, rl, score)
  assert [r["depth"] for r in rows] == [1, 1, 2]
  assert [r["depth_switch"] for r in rows] == [0, 1, 0]
  # Every scoring call saw one depth's prompts: depth 1 in the first two steps, then 2.
  first_d2 = drawn.index({"d2"})
  assert first_d2 >= 2 and drawn == [{"d1"}] * first_d2 + [{"d2"}] * (len(drawn) - first_d2)
  again = composition.Composition(train, cur, seed=0)
  again.restore(json.loads(json.dumps(method.state())))
  assert again.curriculum.depth == 2 and again.state() == method.state()
  summary = method.summary([dict(r, step=i) for i, r in enumerate(rows)])
  assert summary["depth_switch_steps"] == [2] and summary["final_depth"] == 2
  with pytest.raises(ValueError, match=r"no training prompts of depth \[3\]"):
    composition.Composition(train, CurriculumConfig(depths=(1, 2, 3)), seed=0)


def test_unknown_method_names_the_known_ones():
  import ml_collections

  cfg = ml_collections.ConfigDict({"method": "grpo++", "seed": 0})
  known = r"method: unknown 'grpo\+\+'; known: \['composition', 'qbq', 'rlvr', 'svs'\]"
  with pytest.raises(ValueError, match=known):
    methods.check(cfg)  # at launch
  with pytest.raises(ValueError, match=known):
    methods.make(methods.MethodSettings("grpo++"), _prompts(4, 3))
  with pytest.raises(ValueError, match="cannot load 'no_such_module:make'"):
    methods.make(methods.MethodSettings("no_such_module:make"), _prompts(4, 3))
