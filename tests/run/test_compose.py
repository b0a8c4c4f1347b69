"""The Composition-RL dataset build (`rlvr.run.composition_build`, its plan
`rlvr.run.composition_plan`, CLI `launch.compose`): plan, resume bookkeeping, rows, and
end-to-end runs against the real vLLM test server (its tiny model's garbage is rejected)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from paths import REPO
from test_composition import Q1, Q2, Q3, generic_assistant

from rlvr.data.readers import read_dataset
from rlvr.run import composition_build as cr
from rlvr.run import composition_plan as cp
from rlvr.sampling.assistant import Assistant, AssistantError
from synthesis import composition as comp
from synthesis import numbers

AIME = os.path.join(REPO, "data", "math_aime_eval.jsonl")


def _write_jsonl(path, rows):
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


def _compose(out, source, url, *extra, wait=True, **kw):
  cmd = [
    sys.executable,
    "-m",
    "launch.compose",
    f"--source={source}",
    f"--out={out}",
    f"--url={url}",
    *extra,
  ]
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, **kw)
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _ids(path):
  return [r["id"] for r in cr.read_rows(path)] if os.path.exists(path) else []


def _check_report(out, n):
  """Every planned id finished once, in exactly one file, and the report adds up."""
  acc, rej = cr.read_rows(out), cr.read_rows(cr.rejected_path(out))
  ids = [r["id"] for r in acc + rej]
  assert sorted(ids) == sorted(f"c{i}" for i in range(n)), ids
  for r in rej:
    assert r["reason"] and r["stage"] in cr.STAGES and r["level"] >= 1, r
  with open(out + ".report.json") as f:
    report = json.load(f)
  assert (report["planned"], report["finished"]) == (n, n)
  assert (report["accepted"], report["rejected"]) == (len(acc), len(rej))
  funnel = report["funnel"]
  assert funnel[0]["entered"] == n and funnel[-1]["passed"] == len(acc)
  assert sum(sum(s["rejected"].values()) for s in funnel) == len(rej)
  assert all(s["entered"] - s["passed"] == sum(s["rejected"].values()) for s in funnel)
  assert sum(report["rejected_by_reason"].values()) == len(rej)
  return acc, rej, report


# ------------------------------------------------------------------ pure parts
def test_finished_ids_ignore_a_line_cut_short_by_a_kill(tmp_path):
  out = str(tmp_path / "composed.jsonl")
  good = [
    {"id": "c0", "problem": "p0", "answer": "1"},
    {"id": "c1", "problem": "p1", "answer": "2"},
  ]
  with open(out, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in good) + '{"id": "c2", "probl')
  with open(cr.rejected_path(out), "w") as f:
    # c3 finished; c4's line is whole JSON but lacks its newline: cut short all the same.
    f.write(
      '{"id": "c3", "stage": "define", "reason": "missing tag"}\n'
      'not json at all\n{"id": "c4", "stage": "define", "reason": "missing tag"}'
    )
  assert cr.finished_ids(out) == {"c0", "c1", "c3"}
  assert cr.finished_ids(str(tmp_path / "missing.jsonl")) == set()
  assert cr.drop_partial_tail(out) == len('{"id": "c2", "probl')
  assert cr.drop_partial_tail(out) == 0 and cr.drop_partial_tail(str(tmp_path / "none")) == 0
  with open(out, "a") as f:  # appending after the repair gives whole lines only
    f.write(json.dumps({"id": "c2", "problem": "p2", "answer": "3"}) + "\n")
  assert _ids(out) == ["c0", "c1", "c2"]
  assert [e.answer for e in read_dataset(out, on_bad_row="error")] == ["1", "2", "3"]
  one_line = tmp_path / "one.jsonl"
  one_line.write_text('{"id": "c0", "pro')  # no newline anywhere: nothing survives
  assert cr.drop_partial_tail(str(one_line)) == 17 and one_line.read_text() == ""


def test_the_plan_is_fixed_by_the_seed_and_a_larger_n_extends_it():
  problems = cp.load_problems(AIME, "aime")
  plan = cp.make_plan(problems, None, 3, 6, 20, seed=0)
  again = cp.make_plan(problems, None, 3, 10, 20, seed=0)
  other = cp.make_plan(problems, None, 3, 6, 20, seed=1)
  assert [p.id for p in plan] == [f"c{i}" for i in range(6)]
  assert [p.chain for p in plan] == [p.chain for p in again[:6]]
  assert [p.chain for p in plan] != [p.chain for p in other]
  for p in again:
    assert len(p.chain) == 3 and len({q.id for q in p.chain}) == 3
    assert all(numbers.numbers_in(q.answer) for q in p.chain[:2])  # q1, q2 open a Compose
  assert len({p.chain[0].id for p in cp.make_plan(problems, None, 2, 200, 5, 0)}) <= 5
  pairs = cp.make_plan(problems[:10], problems[10:20], 2, 8, 20, seed=0)
  assert all(a in problems[:10] and b in problems[10:20] for a, b in (p.chain for p in pairs))
  # The plan's own draws (no per-draw copy of the problem list) equal composition's.
  openers = [q for q in problems if numbers.numbers_in(q.answer)]
  rng = random.Random(0)
  pools = comp.surrogate_pools(openers, 3, 20, rng)
  assert [p.chain for p in again] == [
    tuple(comp.draw_chain(problems, pools, rng)) for _ in range(10)
  ]
  first = [q for q in problems[:10] if numbers.numbers_in(q.answer)]
  assert [p.chain for p in pairs] == comp.cross_domain_pairs(
    first, problems[10:20], 8, random.Random(0)
  )


def test_the_funnel_counts_each_id_once_per_level_and_stage():
  acc = [{"id": "c0"}]
  rej = [
    {"id": "c1", "level": 1, "stage": "define", "reason": "missing tag"},
    {"id": "c2", "level": 1, "stage": "v2", "reason": "v2 recomputation differs"},
    {"id": "c3", "level": 2, "stage": "define", "reason": "missing tag", "error": "long"},
    {"id": "c1", "level": 1, "stage": "define", "reason": "missing tag"},
  ]  # duplicate
  report = cr.funnel_report(acc, rej, depth=3, planned=5)
  assert (report["finished"], report["accepted"], report["rejected"]) == (4, 1, 3)
  steps = {(s["level"], s["stage"]): (s["entered"], s["passed"]) for s in report["funnel"]}
  assert len(steps) == 12 and steps[(1, "define")] == (4, 3) and steps[(1, "v2")] == (3, 2)
  assert steps[(2, "define")] == (2, 1) and steps[(2, "v3")] == (1, 1)
  assert report["server_refused"] == 1
  assert "L2 define" in cr.format_report(report)


# ------------------------------------------------------------------ rows, flags, the assistant
def test_accepted_rows_carry_provenance_and_load_back_by_depth(tmp_path):
  """compose_one with test_composition's rule-following assistant (hand-written outputs,
  no server): accepted rows at depths 2 and 3 and across domains load with read_dataset,
  their source naming the depth (what method="composition" reads)."""
  src = _write_jsonl(
    tmp_path / "easy.jsonl",
    [{"problem": q.text, "answer": q.answer, "data_source": "easy"} for q in (Q1, Q2, Q3)],
  )

  def answer(prompt):  # the rule-following assistant, silent where its rule finds no number
    try:
      return generic_assistant([prompt])[0]
    except AttributeError:
      return ""

  complete = lambda prompts, on_error=None: [answer(p) for p in prompts]
  problems = cp.load_problems(src, "easy")
  for depth, n in ((2, 4), (3, 6)):
    rows = [cr.compose_one(p, complete) for p in cp.make_plan(problems, None, depth, n, 20, 0)]
    acc = [r for r in rows if "problem" in r]
    rej = [r for r in rows if "problem" not in r]
    # The assistant replaces the first number of the last paragraph; Q1 states one
    # number, so a depth-3 chain ending in Q1 has none left for the outer Compose.
    assert all(
      (r["level"], r["stage"], r["reason"], r["source_ids"][-1])
      == (2, "replace", "missing tag", "easy:0")
      for r in rej
    ), rej
    assert acc
    out = _write_jsonl(tmp_path / f"d{depth}.jsonl", acc)
    loaded = read_dataset(out, on_bad_row="error")
    assert [e.source for e in loaded] == [f"composed-d{depth}"] * len(acc)
    for row, ex in zip(acc, loaded):
      assert row["depth"] == depth and len(row["source_ids"]) == depth
      last = (Q1, Q2, Q3)[int(row["source_ids"][-1].split(":")[1])]
      assert ex.answer == last.answer and ex.problem == row["problem"]
      assert ex.problem.startswith((Q1, Q2, Q3)[int(row["source_ids"][0].split(":")[1])].text)
      assert row["x"] in row["relation"] and row["y"] in row["relation"] and row["v1"]
  second = _write_jsonl(tmp_path / "other.jsonl", [{"question": Q3.text, "ref_answer": 28}])
  plan = cp.make_plan(problems, cp.load_problems(second, "other"), 2, 3, 20, 0)
  rows = [cr.compose_one(p, complete) for p in plan]
  assert [r["answer"] for r in rows] == ["28"] * 3
  assert all(r["source_ids"][1] == "other:0" for r in rows)


def test_an_unreachable_assistant_fails_fast_naming_the_url():
  from rlvr.sampling.vllm_server import free_port

  dead = f"http://127.0.0.1:{free_port()}"
  t0 = time.time()
  with pytest.raises(AssistantError, match=f"{dead}/v1/chat/completions: failed after 2"):
    Assistant(dead, "policy", retries=1, backoff_s=0.01, timeout_s=5).complete(["x"])
  assert time.time() - t0 < 5


@pytest.mark.slow
def test_bad_flags_sources_and_settings_fail_in_one_line(tmp_path, vllm_server):
  url = vllm_server.url
  name = f"--model={vllm_server.options.served_model_name}"
  src = _write_jsonl(
    tmp_path / "easy.jsonl",
    [{"problem": Q1.text, "answer": "6"}, {"problem": Q2.text, "answer": "15"}],
  )
  out = str(tmp_path / "o.jsonl")
  cases = [
    ((f"--source={tmp_path}/none.jsonl",), "cannot read the source"),
    (("--depth=1",), "--depth must be >= 2"),
    (("--bogus=1",), "bogus"),
    (("--n=4", "--depth=3"), "could not draw distinct problems"),
  ]
  for extra, message in cases:
    r = _compose(out, src, url, name, *extra)
    assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
  r = _compose(out, src, url, name, "--n=2", "--seed=0", "--max_tokens=16")
  assert r.returncode == 0, r.stderr
  r = _compose(out, src, url, name, "--n=2", "--seed=1", "--max_tokens=16")
  assert r.returncode == 2 and "planned differently" in r.stderr
  r = _compose(str(tmp_path / "x.jsonl"), src, url, "--model=other")
  assert r.returncode == 1 and "no model 'other'" in r.stderr, r.stderr
  # Settings every request would fail on (the server's context is 1,024 tokens) stop the
  # run before any composition is spent.
  r = _compose(str(tmp_path / "y.jsonl"), src, url, name, "--max_tokens=9999")
  assert r.returncode == 1 and "max_tokens=9999 cannot" in r.stderr, r.stderr
  assert not os.path.exists(tmp_path / "y.jsonl.rejected.jsonl")


# ------------------------------------------------------------------ the real vLLM server
@pytest.mark.slow
def test_garbage_from_the_served_tiny_model_is_rejected_and_counted(tmp_path, vllm_server):
  out = str(tmp_path / "composed.jsonl")
  n = 5
  t0 = time.time()
  r = _compose(
    out,
    AIME,
    vllm_server.url,
    f"--n={n}",
    "--max_tokens=48",
    "--concurrency=4",
    f"--model={vllm_server.options.served_model_name}",
  )
  took = time.time() - t0
  assert r.returncode == 0, r.stderr
  acc, rej, report = _check_report(out, n)
  if acc:
    assert len(read_dataset(out, on_bad_row="error")) == len(acc)
  print(f"\n{r.stdout}\n({took:.1f}s; this run: {report['this_run']})")
  rerun = _compose(out, AIME, vllm_server.url, f"--n={n}", "--max_tokens=48")
  assert rerun.returncode == 0, rerun.stderr
  assert sorted(_ids(out) + _ids(cr.rejected_path(out))) == sorted(r_["id"] for r_ in acc + rej)


@pytest.mark.slow
def test_a_killed_run_resumes_without_duplicates_or_redone_work(tmp_path, vllm_server):
  out = str(tmp_path / "composed.jsonl")
  n = 6
  args = (
    f"--n={n}",
    "--max_tokens=160",
    "--concurrency=1",
    "--seed=3",
    f"--model={vllm_server.options.served_model_name}",
  )
  with open(tmp_path / "log", "w") as log:
    proc = _compose(out, AIME, vllm_server.url, *args, wait=False, stdout=log, stderr=log)
    deadline = time.time() + 300
    while len(_ids(out) + _ids(cr.rejected_path(out))) < 1 and proc.poll() is None:
      assert time.time() < deadline, "no composition finished in 300s"
      time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  before = {r["id"]: r for r in cr.read_rows(out) + cr.read_rows(cr.rejected_path(out))}
  assert 1 <= len(before) < n, f"the first run finished {len(before)} of {n} before the kill"
  r = _compose(out, AIME, vllm_server.url, *args)
  assert r.returncode == 0, r.stderr
  acc, rej, report = _check_report(out, n)
  after = {row["id"]: row for row in acc + rej}
  assert len(acc) + len(rej) == n == len(after)
  assert all(after[i] == row for i, row in before.items())  # finished work was not redone
  # Only the unfinished chains were composed again: at most 6 requests (three steps,
  # three checks) per remaining chain of one level.
  assert 1 <= report["this_run"]["requests"] <= 6 * (n - len(before))
  print(f"\nkilled after {len(before)} of {n}; resumed: {r.stdout}")
