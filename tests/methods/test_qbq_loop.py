"""QbQ's loop: the procedural teacher's answers, an LLM teacher behind the real vLLM
server, the optimizer reset, and whole rounds through launch.train, killed between
stages and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tiny_run
from paths import REPO

from rlvr.data.tasks import arithmetic, variants
from rlvr.methods import qbq as qbq_method
from rlvr.methods import qbq_teachers
from synthesis import qbq


def _solve_for_x(statement: str) -> list[int]:
  """Every x in 0..99 that satisfies "Solve <lhs>=<rhs> for x." (recomputed here)."""
  lhs, rhs = statement[len("Solve ") : -len(" for x.")].split("=")
  return [
    x for x in range(100) if arithmetic.answer_of(f"Compute {lhs.replace('x', str(x))}.") == rhs
  ]


def test_procedural_variants_have_exact_new_answers():
  seeds = arithmetic.generate(300, seed=3, max_operand=9)
  made = {op: 0 for op in variants.OPERATOR_IDS}
  for p in seeds:
    for op in variants.OPERATOR_IDS:
      out = variants.variant(p.problem, p.answer, op)
      if out is None:
        continue
      text, answer = out
      made[op] += 1
      assert answer != p.answer, (p.problem, op, text)
      if op == "O4":
        assert _solve_for_x(text) == [int(answer)], (p.problem, text)
      else:
        assert arithmetic.answer_of(text) == answer, (p.problem, op, text)
        assert text != p.problem
  # Every operator applies to most seeds (O3 needs two operations: all of these have).
  assert all(n > 150 for n in made.values()), made
  # Deterministic, and the plan picks distinct operators.
  assert variants.variant(seeds[0].problem, seeds[0].answer, "O2") == variants.variant(
    seeds[0].problem, seeds[0].answer, "O2"
  )
  plan = variants.plan(seeds[0].problem, 3, salt="1")
  assert len(set(plan)) == 3 and set(plan) <= set(variants.OPERATOR_IDS)


def test_procedural_teacher_rows_carry_lineage_and_reasons():
  seeds = [
    qbq.Variant(f"pool-{i}", "", "", p.problem, p.answer)
    for i, p in enumerate(arithmetic.generate(20, seed=5, max_operand=9))
  ]
  rows = qbq_teachers.procedural_variants(seeds, 3, salt="0")
  assert len(rows) == 60
  for r in rows:
    assert r["id"] == f"{r['parent_id']}/{r['operator']}"
    assert r["reason"] in ("accepted", "abstained")
    assert (r["problem"] is None) == (r["reason"] == "abstained")


def test_llm_teacher_on_the_real_vllm_server_rejects_garbage_with_reasons(vllm_server):
  """The tiny served model is no teacher: every plan falls back to the fixed order and
  every generation is rejected with a reason; nothing crashes."""
  from rlvr.sampling.assistant import Assistant

  teacher = Assistant(vllm_server.url, "policy", temperature=1.0, top_p=1.0, max_tokens=24)
  seeds = [
    qbq.Variant("s0", "", "", "Compute 3+4*2.", "11"),
    qbq.Variant("s1", "", "", "Compute 9-2-3.", "4"),
  ]
  rows = qbq_teachers.llm_variants(seeds, teacher.complete, 3, integer_answers=True)
  teacher.close()
  assert len(rows) == 6 and teacher.requests >= 2 + 6
  assert {r["parent_id"] for r in rows} == {"s0", "s1"}
  assert all(r["reason"] != "accepted" for r in rows), rows
  assert {r["reason"] for r in rows} <= {
    "missing tag",
    "abstained",
    "empty problem",
    "empty answer",
    "answer is not an integer",
  }


def test_reset_optimizer_equals_a_fresh_optimizer(one_device_learner, tiny_dirs):
  import jax

  from rlvr import learner, model
  from rlvr.learner import packing

  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  lrn = one_device_learner(cfg, params, 1e-3)
  arrays = packing.pack_rows([((1, 2, 3), (4, 5, 6), None)], 2, 16, 0)
  batch = lrn.to_batch(dict(arrays, advantages=np.array([1.0, 0.0], np.float32)))
  fresh = [np.asarray(a) for a in jax.tree.leaves(lrn.state.opt_state)]
  stepped, _ = lrn.update_fn(lrn.state, batch)  # donates the state
  reset = learner.reset_optimizer(stepped)
  for a, b in zip(jax.tree.leaves(reset.opt_state), fresh, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(np.any(np.asarray(a) != 0) for a in jax.tree.leaves(stepped.opt_state))
  np.testing.assert_array_equal(
    np.asarray(jax.tree.leaves(reset.params)[0]), np.asarray(jax.tree.leaves(stepped.params)[0])
  )


def test_model_embeddings_are_mean_pooled_hidden_states_whatever_the_batch(tiny_dirs):
  import jax.numpy as jnp
  from transformers import AutoTokenizer

  from rlvr import model
  from rlvr.model.embed import embedder
  from synthesis import diversity

  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  texts = ["Compute 3+4*2.", "Compute 12-5.", "Solve 3+x*2=11 for x."]
  pooled = embedder(params, cfg, tok, batch=2)(texts)  # padded batches of 2, then 1
  for text, row in zip(texts, pooled):
    ids = jnp.asarray([tok.encode(text, add_special_tokens=False)])
    hidden = model.forward(params, ids, config=cfg, return_hidden=True)[0]
    np.testing.assert_allclose(row, np.asarray(hidden).mean(axis=0), atol=1e-5)
  score = diversity.pool_vendi(texts, embedder(params, cfg, tok))
  assert 1.0 <= score <= 3.0


def test_rounds_reset_the_optimizer_only_at_round_starts():
  m = qbq_method.QbQ(qbq_method.QbQConfig(rounds=3, steps_per_round=4), [], "/tmp/x", 0)
  assert [s for s in range(12) if m.resets_optimizer(s)] == [4, 8]


# ------------------------------------------------------------------ whole rounds
_CONFIG = "configs/tiny_qbq.py"


def _flags(policy):
  return [
    f"--config.model.path={policy}",
    "--config.sft.steps=0",
    "--config.data.arithmetic.n_train=48",
    "--config.data.arithmetic.n_heldout=16",
    "--config.qbq.k=4",
    "--config.qbq.select_n=4",
    "--config.qbq.steps_per_round=2",
    "--config.rl.steps=4",
    "--config.eval.every=2",
    "--config.eval.sampling.n=2",
    "--config.checkpoint.every=2",
    "--config.export_hf=False",
    "--config.reward_workers=1",
  ]


_STAGES = ("seeds.jsonl", "variants.jsonl", "scored.jsonl", "selection.jsonl")


@pytest.mark.slow
def test_two_rounds_end_to_end_resume_after_a_kill_between_stages(arithmetic_policy, tmp_path):
  policy, _ = arithmetic_policy
  full = str(tmp_path / "full")
  _, rows = tiny_run.train(full, *_flags(policy), config=_CONFIG)
  assert [r["qbq_round"] for r in rows] == [0, 0, 1, 1]
  assert [r.get("optimizer_reset", 0) for r in rows] == [0, 0, 1, 0]
  # N = 4 problems make one step of 4; the round's second step has nothing left: a
  # skipped update, so the optimizer's update count (2) lags the RL step (4) and the
  # resume below must go by the RL step.
  assert [r["skipped_update"] for r in rows] == [0, 1, 0, 1]
  for t in (0, 1):
    d = os.path.join(full, "qbq", f"round_{t:02d}")
    assert all(os.path.exists(os.path.join(d, s)) for s in _STAGES), os.listdir(d)
    selection = [json.loads(l) for l in open(os.path.join(d, "selection.jsonl"))]
    assert 0 < len(selection) <= 4 and all(r["n"] is not None for r in selection)
  assert os.path.exists(os.path.join(full, "qbq", "round_00", "rescored.jsonl"))
  assert "heldout_pass@1" in rows[1] and "heldout_pass@1" in rows[3]

  # Killed (SIGKILL, no clean-up) once round 1's variants are written, i.e. while it
  # scores them; the rerun reuses seeds and variants, computes the rest, and ends with
  # the same metrics as the uninterrupted run.
  cut = tmp_path / "cut"
  variants_file = cut / "qbq" / "round_01" / "variants.jsonl"
  proc = subprocess.Popen(
    tiny_run.argv(cut, *_flags(policy), config=_CONFIG),
    cwd=REPO,
    env=tiny_run.env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  while proc.poll() is None and not variants_file.exists():
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  assert variants_file.exists()
  # Scoring a round's variants takes a generate call (>= 100s of ms here), so the kill
  # lands before the selection is written; a much faster machine may finish the round
  # first, and the rerun below must then resume from the same files just as well.
  if (cut / "qbq" / "round_01" / "selection.jsonl").exists():
    print("note: the kill came after round 1's selection; resumed from complete stages")
  written = variants_file.stat().st_mtime_ns
  out = tiny_run.launch(cut, *_flags(policy), config=_CONFIG)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed qbq from step 2" in out.stdout
  assert variants_file.stat().st_mtime_ns == written  # reused, not regenerated
  for s in _STAGES:
    assert (cut / "qbq" / "round_01" / s).read_text() == open(
      os.path.join(full, "qbq", "round_01", s)
    ).read(), s
  resumed = tiny_run.rows(cut / "metrics.jsonl", timing=True)
  assert [r["step"] for r in resumed] == [0, 1, 2, 3]
  # Per-round diversity with the policy's embeddings (command in docs/methods.md).
  out = subprocess.run(
    [sys.executable, "-m", "launch.qbq_diversity", f"--run={full}", f"--model={policy}"],
    cwd=REPO,
    env=tiny_run.env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.load(open(os.path.join(full, "qbq", "diversity.json")))
  assert [r["round"] for r in report["rounds"]] == [0, 1]
  assert all(r["selection_vendi"] >= 1.0 for r in report["rounds"])
  for a, b in zip(rows[2:], resumed[2:]):
    for k in a:
      if not k.startswith(tiny_run.TIMING):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
