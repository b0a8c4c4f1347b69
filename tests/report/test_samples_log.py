"""Training responses on disk (`rl.log_samples_every`): the writer on real groups and files,
and a whole launch.train run that logs every step, then resumes."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest
import test_tracking
import tiny_run
from tiny_run import RAW_PROMPTS_RUN

from configs import tiny_rlvr
from rlvr import rollout
from rlvr.data import datasets
from rlvr.report import metrics, samples_log
from rlvr.sampling.types import Completion

offline = test_tracking.offline  # wandb in offline mode (fixture)


def _group(text: str, answer: str, rewards, source: str = "train", **tags) -> rollout.Group:
  comps = [
    Completion(tuple(range(k + 1)), None, f"{text} response {k}", "stop" if k else "length")
    for k in range(len(rewards))
  ]
  rewards = np.asarray(rewards, np.float32)
  prompt = rollout.Prompt((1, 2, 3), answer, text, source)
  return rollout.Group(prompt, comps, rewards, rewards > 0.5, dict(tags))


def test_records_cover_sampled_then_update_only_groups(tmp_path):
  solved = _group("1+1", "2", [1.0, 0.0, 1.0], data_type="original")
  unsolved = _group("2+2", "4", [0.0, 0.0, 0.0], data_type="original")  # sampled, not kept
  synthetic = _group("x+1=3", "2", [1.0, 0.0, 0.0], source="svs-synthetic", data_type="synthetic")
  shown = []
  log = samples_log.SamplesLog(
    str(tmp_path), 2, decode=lambda ids: f"ids {list(ids)}", show=lambda *a: shown.append(a)
  )
  assert [log.due(s) for s in range(5)] == [True, False, True, False, True]
  out = log.write(4, [solved, synthetic], [solved, unsolved])
  assert out == os.path.join(tmp_path, "samples", "step_4.jsonl")
  rows = metrics.read_jsonl(out)
  assert [(r["group"], r["index"]) for r in rows] == [(g, i) for g in range(3) for i in range(3)]
  assert {r["step"] for r in rows} == {4}
  assert [r["kept"] for r in rows] == [True] * 3 + [False] * 3 + [True] * 3
  assert [r["tags"]["data_type"] for r in rows[::3]] == ["original", "original", "synthetic"]
  assert [r["source"] for r in rows[::3]] == ["train", "train", "svs-synthetic"]
  assert [r["reward"] for r in rows] == [1, 0, 1, 0, 0, 0, 1, 0, 0]
  assert [r["correct"] for r in rows] == [r["reward"] > 0.5 for r in rows]
  assert rows[7] == {
    "step": 4,
    "group": 2,
    "index": 1,
    "source": "svs-synthetic",
    "tags": {"data_type": "synthetic"},
    "kept": True,
    "prompt": "ids [1, 2, 3]",
    "answer": "2",
    "response": "x+1=3 response 1",
    "response_seen": "ids [0, 1]",
    "reward": 0.0,
    "correct": False,
    "finish_reason": "stop",
    "response_tokens": 2,
  }
  assert shown == [(4, rows[: samples_log.SHOWN])]
  # Without a decoder the prompt is the problem text.
  (row, *_) = samples_log.records(0, [solved], [], decode=None)
  assert row["prompt"] == "1+1" and row["kept"]


def test_a_resumed_log_replaces_later_steps_and_a_failed_write_keeps_the_file(tmp_path):
  workdir = str(tmp_path)
  first = _group("1+1", "2", [1.0, 0.0])
  log = samples_log.SamplesLog(workdir, 1)
  for step in range(4):
    log.write(step, [first], [first])
  assert samples_log.logged_steps(workdir) == [0, 1, 2, 3]
  before = open(samples_log.path(workdir, 1)).read()
  # Processes other than 0 neither remove nor write files.
  other = samples_log.SamplesLog(workdir, 1, resume_step=0, enabled=False)
  assert not other.due(0) and samples_log.logged_steps(workdir) == [0, 1, 2, 3]
  # Resumed at step 2: steps 2 and 3 go, those before stay as they are.
  again = _group("3+3", "6", [0.0, 1.0, 1.0])
  log = samples_log.SamplesLog(workdir, 1, resume_step=2)
  assert samples_log.logged_steps(workdir) == [0, 1]
  assert open(samples_log.path(workdir, 1)).read() == before
  log.write(2, [again], [again])
  log.write(2, [again], [again])  # written twice: replaced, never appended
  rows = metrics.read_jsonl(samples_log.path(workdir, 2))
  assert [r["response"] for r in rows] == [f"3+3 response {k}" for k in range(3)]
  # A write that fails part-way (a tag JSON cannot hold) leaves the file as it was, and
  # no temporary beside it.
  bad = _group("4+4", "8", [1.0, 0.0], note={1, 2})
  with pytest.raises(TypeError):
    log.write(2, [again, bad], [again, bad])
  assert metrics.read_jsonl(samples_log.path(workdir, 2)) == rows
  assert sorted(os.listdir(tmp_path / "samples")) == [f"step_{s}.jsonl" for s in (0, 1, 2)]


def test_sample_rows_go_to_tensorboard_text_and_a_wandb_table(tmp_path, offline):
  from rlvr.run import sections

  rows = samples_log.records(3, [], [_group("1+1", "2", [1.0, 0.0], data_type="original")])
  rows[1]["response"] = "line one\nline two"
  cfg = sections.LoggingConfig(wandb=True, wandb_project="samples-test")
  w = metrics.MetricsWriter(str(tmp_path / "run"), resume_step=0, logging=cfg)
  w.write_table(3, "samples", rows)
  test_tracking._close(w)
  ((step, text),) = _tensorboard_texts(str(tmp_path / "run" / "tensorboard"), "samples")
  assert step == 3 and "1+1 response 0" in text and "    line one\n    line two" in text
  assert "correct **True**" in text and "data_type" in text
  (run_file,) = test_tracking._run_files(offline)
  (logged,) = [h for h in test_tracking._read_run(run_file)["history"] if "samples/path" in h]
  assert logged["step"] == 3 and logged["samples/_type"] == "table-file"
  table = json.load(open(os.path.join(os.path.dirname(run_file), "files", logged["samples/path"])))
  assert table["columns"] == list(rows[0])
  assert [dict(zip(table["columns"], d)) for d in table["data"]] == [
    {**r, "tags": json.dumps(r["tags"])} for r in rows
  ]


def _tensorboard_texts(logdir: str, tag: str) -> list[tuple[int, str]]:
  """(step, text) of each text event under `tag` in the events files of `logdir`."""
  from tensorboardX.proto import event_pb2

  found = []
  for name in sorted(os.listdir(logdir)):
    data, pos = open(os.path.join(logdir, name), "rb").read(), 0
    while pos < len(data):  # records: u64 length, u32 crc, Event, u32 crc
      size = int.from_bytes(data[pos : pos + 8], "little")
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + size])
      pos += size + 16
      found += [
        (event.step, v.tensor.string_val[0].decode())
        for v in event.summary.value
        if v.tag == f"{tag}/text_summary"
      ]
  return found


# A user's reward that differs from response to response, so that each record's reward can
# be checked against its own response.
REWARD_MODULE = """
def score(responses, answers, prompts):
  return [float(len(r) % 4) / 3 for r in responses]
"""


def _train(workdir, tmp_path, steps: int) -> None:
  flags = [  # the shapes of test_custom_reward's run: its compiled programs are reused
    f"--config.rl.steps={steps}",
    "--config.rl.log_samples_every=1",
    *RAW_PROMPTS_RUN,
    "--config.reward.domain=samples_reward:score",
    "--config.reward.preflight=False",  # a toy reward: it pays for length
    "--config.checkpoint.every=2",
    "--config.export_hf=False",
  ]
  tiny_run.train(workdir, *flags, environ=tiny_run.env(tmp_path), timeout=600)


def test_launch_train_logs_every_step_and_a_resumed_run_replaces_what_it_reruns(tmp_path):
  (tmp_path / "samples_reward.py").write_text(textwrap.dedent(REWARD_MODULE))
  workdir = tmp_path / "run"
  _train(workdir, tmp_path, steps=2)  # checkpoint at step 2
  samples = workdir / "samples"
  assert samples_log.logged_steps(str(workdir)) == [0, 1]
  kept = {s: (samples / f"step_{s}.jsonl").read_text() for s in (0, 1)}
  # What a run stopped past its last checkpoint leaves: files of steps the rerun redoes.
  (samples / "step_2.jsonl").write_text(json.dumps({"step": 2, "stale": True}) + "\n")
  (samples / "step_5.jsonl").write_text(json.dumps({"step": 5, "stale": True}) + "\n")
  _train(workdir, tmp_path, steps=3)  # resumes at step 2
  assert samples_log.logged_steps(str(workdir)) == [0, 1, 2]
  assert {s: (samples / f"step_{s}.jsonl").read_text() for s in (0, 1)} == kept
  rows = metrics.read_jsonl(str(workdir / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2]
  c = tiny_rlvr.get_config()
  c.data.arithmetic.n_sft, c.data.arithmetic.n_train, c.data.arithmetic.n_heldout = 0, 8, 2
  answer = {e.problem: e.answer for e in datasets.prepare(c.data, c.seed).train}
  for row in rows:
    recs = metrics.read_jsonl(str(samples / f"step_{row['step']}.jsonl"))
    assert len(recs) == 2 * 4 and all("stale" not in r for r in recs)
    assert sorted((r["group"], r["index"]) for r in recs) == [
      (g, i) for g in (0, 1) for i in range(4)
    ]
    assert {r["step"] for r in recs} == {row["step"]} and all(r["kept"] for r in recs)
    for r in recs:  # each reward is the user's function of that record's own response
      assert r["reward"] == pytest.approx(len(r["response"]) % 4 / 3)
      assert r["correct"] == (r["reward"] > 0) and r["tags"] == {}
      assert answer[r["prompt"].strip()] == r["answer"]  # the problem the answer is of
    assert np.mean([r["reward"] for r in recs]) == pytest.approx(row["reward_mean"])
    assert np.mean([r["correct"] for r in recs]) == pytest.approx(row["accuracy"])
    for g in (0, 1):  # a group's responses share one prompt and its answer
      assert len({(r["prompt"], r["answer"]) for r in recs if r["group"] == g}) == 1
  texts = _tensorboard_texts(str(workdir / "tensorboard"), "samples")
  assert [step for step, _ in texts] == [0, 1, 2]  # each logged step once, after the resume
