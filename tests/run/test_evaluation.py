"""evaluate_set's bookkeeping: prompts that do not fit, per-seed counts, the samples file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rules import even_length
from transformers import AutoTokenizer

from rlvr import model
from rlvr.rollout import Prompt
from rlvr.run import evaluation
from rlvr.sampling import JaxSampler


@pytest.fixture(scope="module")
def sampler(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  return JaxSampler(cfg, params, AutoTokenizer.from_pretrained(tiny_dirs["qwen2"]))


def test_prompts_too_long_are_skipped_and_the_samples_keep_set_indices(
  sampler, tmp_path, check_samples
):
  context = 40
  prompts = [
    Prompt((5, 6, 7), "1", "first"),
    Prompt(tuple(range(3, 40)), "2", "too long"),
    Prompt((9, 10, 11, 12), "3", "third"),
  ]
  ecfg = evaluation.EvalConfig(n=4, seeds=(0, 1), max_tokens=6, batch_prompts=1)
  path = tmp_path / "out" / "samples_x.jsonl"
  result = evaluation.evaluate_set(
    sampler, prompts, even_length, ecfg, context=context, samples_path=str(path)
  )
  assert (result["problems"], result["skipped_too_long"]) == (2, 1)
  rows = check_samples(path, result)
  assert [(r["seed"], r["index"], r["problem"], r["answer"]) for r in rows] == [
    (0, 0, "first", "1"),
    (0, 2, "third", "3"),
    (1, 0, "first", "1"),
    (1, 2, "third", "3"),
  ]
  for r in rows:
    for x in r["responses"]:
      assert x["reward"] == float(len(x["text"]) % 2 == 0) and x["correct"] == (x["reward"] > 0)
      assert 0 < x["tokens"] <= 6 and x["finish_reason"] in ("stop", "length")
  outcomes = [x["correct"] for r in rows for x in r["responses"]]
  assert any(outcomes) and not all(outcomes)  # the check above compared real counts
  # The counts behind pass@k are the file's: avg@n per seed is its fraction correct.
  for s in result["per_seed"]:
    mine = [x["correct"] for r in rows if r["seed"] == s["seed"] for x in r["responses"]]
    assert s["avg@4"] == pytest.approx(np.mean(mine))
  # Without a path nothing is written, and the numbers are the same (seeded sampling).
  again = evaluation.evaluate_set(sampler, prompts, even_length, ecfg, context=context)
  assert json.dumps(again["per_seed"]) == json.dumps(result["per_seed"])
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["out", "samples_x.jsonl"]


def test_a_failed_evaluation_leaves_the_old_samples_file_as_it_was(sampler, tmp_path):
  path = tmp_path / "samples_x.jsonl"
  path.write_text("an earlier evaluation's samples\n")

  batches = 0

  def fails_on_the_second_batch(texts, golds, prompts=None):
    nonlocal batches
    batches += 1
    if batches == 2:
      raise RuntimeError("verifier down")
    return even_length(texts, golds)

  ecfg = evaluation.EvalConfig(n=2, max_tokens=4, batch_prompts=1)
  prompts = [Prompt((5, 6, 7), "1", "a"), Prompt((8, 9), "2", "b")]
  with pytest.raises(RuntimeError, match="verifier down"):
    evaluation.evaluate_set(
      sampler, prompts, fails_on_the_second_batch, ecfg, samples_path=str(path)
    )
  assert path.read_text() == "an earlier evaluation's samples\n"


def _result(seeds, pass1, pass2):
  """An evaluate_set result with n=2 and the given per-seed pass@1 / pass@2."""
  agg = lambda xs: (float(np.mean(xs)), float(np.std(xs)))
  return {
    "n": 2,
    "problems": 30,
    "skipped_too_long": 0,
    "seeds": list(seeds),
    "pass@k": {1: agg(pass1), 2: agg(pass2)},
    "avg@2": agg(pass1),
    "per_seed": [{"seed": s} for s in seeds],
  }


def test_report_gives_std_only_over_several_seeds(tmp_path):
  evaluation.write_report({"heldout": _result([0], [0.433], [0.5])}, str(tmp_path / "one"))
  table = (tmp_path / "one" / "eval.md").read_text()
  assert "| heldout | 43.3 | 50.0 | 43.3 |" in table and "±" not in table
  assert "one sampling seed" in table
  # The csv keeps its std column (0 over one seed).
  assert "heldout,pass@k,1,0.433000,0.000000" in (tmp_path / "one" / "eval.csv").read_text()
  evaluation.write_report(
    {"heldout": _result([0, 1], [0.4, 0.5], [0.5, 0.7])}, str(tmp_path / "two")
  )
  table = (tmp_path / "two" / "eval.md").read_text()
  assert "| heldout | 45.0 ± 5.0 | 60.0 ± 10.0 | 45.0 ± 5.0 |" in table
  assert "mean ± std over 2 sampling seeds" in table
