"""Every command of the README and of the docs pages runs in a test and exits 0, scaled down
by flags.

The commands are read from the pages themselves (COMMAND_FILES: README.md and docs/*.md): their
```bash blocks (comments dropped, `\\` continuations joined, `&&` chains split) and the
`python -m launch.*` commands quoted inline in their prose. Each one is

- run here (RUN_HERE: README command prefix -> the test below that runs it), with its
  placeholders (DIR, FILE, N, URL, OUT.jsonl, pairs.jsonl, ...) replaced by real local
  things and scale-down flags appended (absl: the last value of a flag wins);
- run by another test, exactly that command with scale-down flags (COVERED_ELSEWHERE:
  prefix -> the test file and the text in it that runs the command, checked here);
- not a command a test can run (NOT_RUN: the installer, the test suite itself);
- cluster-only (CLUSTER_ONLY, by leading word: srun, gcloud). Those are not run, but the
  `launch.train` inside each resolves its flags (`--print_config`) and the
  `launch.serve_vllm` inside parses its flags.

`test_every_readme_command_is_covered` fails on a README command that is none of these.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from paths import REPO

README = os.path.join(REPO, "README.md")
# Pages whose commands no test runs as printed (wandb and TensorBoard, servers with weight
# transfer, the MoE run); every other docs page is read.
NOT_READ = ("docs/moe.md", "docs/tracking.md", "docs/weight_transfer.md")
COMMAND_FILES = (
  "README.md",
  *sorted(
    os.path.relpath(p, REPO)
    for p in glob.glob(os.path.join(REPO, "docs", "*.md"))
    if os.path.relpath(p, REPO) not in NOT_READ
  ),
)
AIME = "data/math_aime_eval.jsonl"  # relative: the commands run from the repo root
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")

RUN_HERE = {
  "python -m launch.train --config=configs/base.py --config.model.path=": "test_grpo_on_your_model_your_data_your_reward",
  "python -m launch.train --config=configs/tiny.py --print_config": "test_print_config_prints_the_resolved_config",
  "python -m launch.make_tiny ": "test_make_tiny_writes_a_model",
  "python -m launch.sft ": "test_sft_on_pairs_writes_a_model",
  "python -m launch.evaluate --model=": "test_evaluate_a_model_on_the_shipped_eval_set",
  "python -m launch.serve_vllm ": "test_serve_vllm_then_compose_against_it",
  "python -m launch.compose ": "test_serve_vllm_then_compose_against_it",
  "python -m launch.train --config=configs/tiny_rlvr.py --config.method=my_methods:make": "test_train_with_the_readme_method_from_outside_the_library",
  "python -m launch.train --config=configs/tiny_composition.py": "test_composition_curriculum_at_embedded_scale",
  "python -m launch.train --config=configs/tiny_rlvr.py --config.reward.domain=my_reward:score": "test_train_with_the_readme_reward_from_outside_the_library",
  "python -m launch.train --config=configs/tiny_rlvr.py --config.reward.domain=my_reward:compute_score,": "test_train_with_the_readme_reward_from_outside_the_library",
  "python -m launch.train --config=configs/tiny_rlvr.py --config.env.name=my_env:make": "test_train_with_the_readme_environment_from_outside_the_library",
  "python -m launch.train --config=configs/tiny_tool.py": "test_tiny_tool_calls_the_python_tool",
  "python -m launch.train --config=configs/tiny_rlvr_lora.py": "test_tiny_rlvr_lora_trains_adapters_and_exports_them",
}
# The README's main command and `evaluate --run` (docs/launch.md): the embedded default end to
# end (SFT, eval, SvS steps, eval) takes minutes even scaled down, and the fresh-clone test
# already runs it, from the README's own text.
_EMBEDDED = "tests/e2e/test_fresh_clone.py::test_readme_setup_and_main_command_in_a_fresh_clone"
# The real model's job and its SvS recipe: one scaled-down run of the recipe, SFT through an
# SvS step on a vLLM server the run starts; the recipe is the job with SvS's settings only
# (test_the_svs_job_is_the_plain_job_plus_svs).
_SMOLLM2 = (
  "tests/model/test_gguf.py::test_one_svs_step_of_the_real_job_through_a_vllm_server",
  ('config="configs/smollm2_arith_svs.py"', "smollm2_arith.get_config()"),
)
COVERED_ELSEWHERE = {  # prefix -> (where, texts of that test file that run the command)
  "python -m launch.train --config=configs/tiny.py [--workdir=DIR] [--config.rl.steps=N]": (
    _EMBEDDED,
    ('cmd = [*main.split(), f"--workdir={workdir}", *SCALE_DOWN]', '"--config.rl.steps=3"'),
  ),
  ".venv/bin/python -m launch.train --config=configs/tiny.py": (
    _EMBEDDED,
    ('main = next(c for c in commands if c.startswith(".venv/bin/python -m launch.train"))',),
  ),
  "python -m launch.evaluate --run=": (_EMBEDDED, ('"launch.evaluate", f"--run={workdir}"',)),
  # needs a finished QbQ run (an SFT'd policy, two rounds); that run skips the HF export,
  # so it passes --model: the README's default (<run>/policy) is not what it runs
  # every paper config through configs/cpu.py, in process (runner.run), on an SFT'd model
  "python -m launch.train --config=configs/cpu.py:": (
    "tests/e2e/test_scale_down.py::test_a_paper_config_scaled_down_runs_two_steps",
    ("cpu.get_config(name)", "runner.run(c)"),
  ),
  "python -m launch.train --config=configs/tiny_code.py": (
    "tests/e2e/test_code_domain.py::test_tiny_code_runs_then_evaluates_on_humaneval",
    ("tiny_code.get_config()", "runner.run(c)"),
  ),
  ".venv/bin/python -m launch.train --config=configs/smollm2_arith.py": _SMOLLM2,
  "python -m launch.train --config=configs/smollm2_arith.py": _SMOLLM2,
  "python -m launch.train --config=configs/smollm2_arith_svs.py": _SMOLLM2,
  # the reward's preflight alone, no model: on a file whose gold answers score and on one whose don't
  "python -m launch.evaluate --preflight --data=": (
    "tests/rewards/test_preflight.py::test_launch_evaluate_runs_the_preflight_alone",
    ('"--preflight"', 'module="launch.evaluate"', 'f"--data={path}"'),
  ),
  "python -m launch.qbq_diversity --run=": (
    "tests/methods/test_qbq_loop.py::test_two_rounds_end_to_end_resume_after_a_kill_between_stages",
    ('"launch.qbq_diversity", f"--run={full}"',),
  ),
}
NOT_RUN = {
  "bash scripts/setup.sh": "the installer: it builds the .venv and .venvs/vllm this suite "
  "runs in (needs the package index); tests/e2e/test_fresh_clone.py "
  "runs the plain form in a clean clone",
  ".venv/bin/python -m pytest": "the test suite itself",
  "python bench/race_trl.py": "the race with TRL: TRL's own environment (scripts/setup.sh "
  "--trl) is not part of the test set-up; figures in docs/benchmarks.md, run by hand",
}
CLUSTER_ONLY = ("srun", "gcloud")  # SLURM GPU nodes, a TPU pod slice


# ------------------------------------------------------------------ reading the README
def _python_blocks(page: str) -> list[str]:
  """The ```python blocks of a page (README.md, docs/*.md) as printed."""
  with open(os.path.join(REPO, page)) as f:
    return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


def readme_commands(text: str | None = None) -> list[str]:
  """Every command of the bash blocks of `text` (default: each of COMMAND_FILES in turn), then
  the inline `python -m launch.*` ones, each on one line with single spaces."""
  if text is None:
    commands = []
    for name in COMMAND_FILES:
      with open(os.path.join(REPO, name)) as f:
        commands += readme_commands(f.read())
    return commands
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    logical = ""
    for line in block.splitlines():
      line = re.sub(r"(^|\s)#.*$", "", line).strip()  # the README quotes no `#`
      logical += " " + line
      if logical.endswith("\\"):
        logical = logical[:-1]
        continue
      logical = " ".join(logical.split()).rstrip("&").strip()
      if logical:
        commands += (
          [logical]
          if logical.split()[0] in CLUSTER_ONLY
          else [c.strip() for c in logical.split("&&")]
        )
      logical = ""
    assert not logical.strip(), f"README bash block ends inside a command: {logical}"
  prose = re.sub(r"```.*?```", "", text, flags=re.S)
  commands += [" ".join(c.split()) for c in re.findall(r"`(python -m launch\.[^`]*)`", prose)]
  return commands


def _classify(command: str):
  if command.split()[0] in CLUSTER_ONLY:
    return [("cluster", command.split()[0])]
  tables = (("here", RUN_HERE), ("elsewhere", COVERED_ELSEWHERE), ("not run", NOT_RUN))
  return [
    (kind, prefix)
    for kind, table in tables
    for prefix in table
    if command == prefix.strip() or command.startswith(prefix)
  ]


def readme(prefix: str) -> list[str]:
  """The README commands this file runs under `prefix` (at least one)."""
  found = [c for c in readme_commands() if c == prefix.strip() or c.startswith(prefix)]
  assert found, f"no README command starts with {prefix!r}; update RUN_HERE"
  return found


_PLACEHOLDER = re.compile(r"=(DIR|FILE|N|URL|OUT\.jsonl|pairs\.jsonl)$")


def argv(command: str, subs: dict[str, str] | None = None, extra=()) -> list[str]:
  """A README command as the argv run from the repo root: `python` -> this interpreter,
  optional `[...]` parts dropped, whole tokens replaced by `subs` (each must occur: the
  README still says what the test assumes), `extra` flags appended."""
  tokens = shlex.split(re.sub(r"\s\[[^\]]*\]", "", command))
  assert tokens[:2] == ["python", "-m"], command
  subs = dict(subs or {})
  missing = [t for t in subs if t not in tokens]
  assert not missing, f"README command {command!r} no longer has {missing}"
  tokens = [subs.get(t, t) for t in tokens[1:]]
  left = [t for t in tokens if _PLACEHOLDER.search(t)]
  assert not left, f"placeholders left in {command!r}: {left}"
  return [sys.executable, *tokens, *map(str, extra)]


def run(cmd, timeout=600, env=None):
  t0 = time.time()
  out = subprocess.run(
    cmd, cwd=REPO, env=env or ENV, capture_output=True, text=True, timeout=timeout
  )
  print(f"\n$ {' '.join(cmd[1:])}\n  ({time.time() - t0:.1f}s, exit {out.returncode})")
  assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
  return out


# ------------------------------------------------------------------ the guard
def test_every_readme_command_is_covered():
  commands = readme_commands()
  assert len(commands) >= 15, commands
  unknown = [c for c in commands if not _classify(c)]
  ambiguous = [(c, _classify(c)) for c in commands if len(_classify(c)) > 1]
  assert not unknown, (
    "README commands that no test runs: run them here (RUN_HERE) or name "
    f"the test that does (COVERED_ELSEWHERE): {unknown}"
  )
  assert not ambiguous, ambiguous
  # Every table entry still matches a README command, and names a test that exists.
  for table in (RUN_HERE, COVERED_ELSEWHERE, NOT_RUN):
    for prefix in table:
      assert any(c == prefix.strip() or c.startswith(prefix) for c in commands), prefix
  for name in set(RUN_HERE.values()):
    assert callable(globals().get(name)), name
  for where, texts in COVERED_ELSEWHERE.values():
    path, test = where.split("::")
    with open(os.path.join(REPO, path)) as f:
      source = f.read()
    assert f"def {test}(" in source, where
    flat = " ".join(source.split())  # the formatter may wrap a call over several lines
    for text in texts:
      assert text in flat, (where, text)
  kinds = {k for c in commands for k, _ in _classify(c)}
  assert kinds == {"here", "elsewhere", "not run", "cluster"}, kinds
  for c in commands:  # the coverage table, with -s
    [(kind, key)] = _classify(c)
    where = {"here": RUN_HERE, "elsewhere": COVERED_ELSEWHERE, "not run": NOT_RUN}.get(kind)
    target = where[key] if where else "cluster-only"
    print(f"{kind:>9}: {c[:90]}  ->  {target[0] if isinstance(target, tuple) else target}")


def _launch_argvs(command: str) -> list[list[str]]:
  """The `python -m launch.X ...` argvs inside a (cluster) command line, also inside a
  quoted `--command="..."`."""
  found, tokens = [], shlex.split(command)
  for i, tok in enumerate(tokens):
    if "python -m launch." in tok:  # a quoted inner command line
      found += _launch_argvs(tok.split("=", 1)[1] if tok.startswith("--") else tok)
    elif tok.endswith("python") and tokens[i + 1 : i + 2] == ["-m"]:
      rest = tokens[i + 2 :]
      stop = next((j for j, t in enumerate(rest) if t in ("&", "&&", ";", "|")), len(rest))
      found.append(rest[:stop])
  return found


def test_cluster_commands_resolve_their_flags():
  """srun / gcloud lines cannot run here; the launch commands inside them take their flags:
  launch.train resolves its config (--print_config) with every value given, and
  launch.serve_vllm parses its flags."""
  cluster = [c for c in readme_commands() if c.split()[0] in CLUSTER_ONLY]
  assert {c.split()[0] for c in cluster} == set(CLUSTER_ONLY), cluster
  launched = [a for c in cluster for a in _launch_argvs(c)]
  assert sorted({a[0] for a in launched}) == ["launch.serve_vllm", "launch.train"], launched
  for args in launched:
    if args[0] == "launch.train":
      out = run([sys.executable, "-m", *args, "--print_config"])
      for flag in args[1:]:
        key, value = flag.lstrip("-").split("=", 1)
        if key != "config":
          assert value in out.stdout, (flag, out.stdout[-3000:])
      assert "coordinator: auto" in out.stdout
    else:
      code = (
        "import sys; from launch import serve_vllm as s; s.FLAGS(sys.argv); "
        "print(s.FLAGS.device, s.FLAGS.host, s.FLAGS.port, bool(s.FLAGS.api_key))"
      )
      out = run([sys.executable, "-c", code, *args[1:]])
      assert out.stdout.split() == ["gpu", "0.0.0.0", "8000", "True"], out.stdout


# ------------------------------------------------------------------ commands run here
def test_print_config_prints_the_resolved_config():
  [command] = readme("python -m launch.train --config=configs/tiny.py --print_config")
  out = run(argv(command), timeout=300)
  # tiny.py's own settings over base.py's, one of them from tiny_rlvr.py it extends
  for line in (
    "workdir: workdir/tiny",
    "method: svs",
    "template: arithmetic",
    "max_prompt_len: 64",
    "kind: arithmetic",
  ):
    assert line in out.stdout, line


@pytest.fixture(scope="module")
def made_tiny(tmp_path_factory):
  """The README's make_tiny command; its model is the DIR of the commands after it."""
  [command] = readme("python -m launch.make_tiny ")
  out_dir = str(tmp_path_factory.mktemp("readme") / "tiny_model")
  out = run(argv(command, {"--out=DIR": f"--out={out_dir}"}), timeout=300)
  return out_dir, out.stdout


def test_make_tiny_writes_a_model(made_tiny):
  out_dir, stdout = made_tiny
  with open(os.path.join(out_dir, "config.json")) as f:
    assert json.load(f)["model_type"] == "qwen3"
  assert re.search(r"wrote qwen3 model with [\d,]+ parameters to " + re.escape(out_dir), stdout)
  for name in ("model.safetensors", "tokenizer.json"):
    assert os.path.exists(os.path.join(out_dir, name)), name


@pytest.mark.slow
def test_sft_on_pairs_writes_a_model(made_tiny, tmp_path):
  """Both README sft commands (full fine-tuning; QbQ's M0 with LoRA, inline) on 8 pairs."""
  commands = readme("python -m launch.sft ")
  assert len(commands) == 2, commands
  pairs = tmp_path / "pairs.jsonl"
  with open(pairs, "w") as f:  # launch.sft's default fields: prompt, completion
    for a in range(8):
      f.write(
        json.dumps(
          {
            "prompt": f"Compute {a}+{a + 1}.",
            "completion": f"{a}+{a + 1}={2 * a + 1}. \\boxed{{{2 * a + 1}}}",
          }
        )
        + "\n"
      )
  from transformers import AutoConfig

  for i, command in enumerate(commands):
    data = next(t for t in shlex.split(command) if t.startswith("--data="))
    workdir = tmp_path / f"sft{i}"
    out = run(
      argv(
        command,
        {"--model=DIR": f"--model={made_tiny[0]}", data: f"--data={pairs}"},
        ["--steps=3", "--batch_size=4", f"--workdir={workdir}"],
      )
    )
    assert f"SFT model written to {workdir / 'model'}" in out.stdout
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    # --epochs (M0's 3 passes over 8 pairs in batches of 4) takes over from --steps
    steps = 6 if "--epochs=3" in command else 3
    assert [r["step"] for r in rows] == list(range(steps)) and all(r["nll"] > 0 for r in rows)
    assert AutoConfig.from_pretrained(workdir / "model").model_type == "qwen3"
    assert (workdir / "model" / "model.safetensors").exists()


def test_evaluate_a_model_on_the_shipped_eval_set(made_tiny, tmp_path, check_samples):
  [command] = readme("python -m launch.evaluate --model=")
  out = run(
    argv(
      command,
      {"--model=DIR": f"--model={made_tiny[0]}"},
      ["--limit=2", "--max_tokens=8", "--reward_workers=1", f"--workdir={tmp_path}"],
    )
  )
  report = json.loads((tmp_path / "eval.json").read_text())["math_aime_eval"]
  assert (report["problems"], report["n"], report["seeds"]) == (2, 8, [0, 1, 2])
  rows = check_samples(tmp_path / "samples_math_aime_eval.jsonl", report)
  with open(os.path.join(REPO, AIME)) as f:
    shipped = [json.loads(next(f)) for _ in range(2)]
  assert [(r["problem"], r["answer"]) for r in rows[:2]] == [
    (e["question"], e["ref_answer"]) for e in shipped
  ]
  assert all(0 < x["tokens"] <= 8 for r in rows for x in r["responses"])
  assert all(0.0 <= m <= 1.0 for m in report["pass@k"]["8"])
  assert "| math_aime_eval |" in out.stdout
  assert (tmp_path / "pass_at_k.png").exists()


def _get_json(url, timeout=10):
  with urllib.request.urlopen(url, timeout=timeout) as r:
    return json.loads(r.read())


@pytest.mark.slow
def test_serve_vllm_then_compose_against_it(made_tiny, tmp_path):
  """launch.serve_vllm on the make_tiny model (a free port for 8000), up until it prints
  its URL; both README compose commands against it (the tiny model's output is rejected,
  and counted); then SIGTERM stops it cleanly (exit 0). A second server besides the
  session fixture's: launch.serve_vllm's own flags, readiness line and signal handling are
  what this checks, which `rlvr.sampling.vllm_server.start_server` alone does not."""
  from rlvr.sampling.vllm_server import free_port

  [serve] = readme("python -m launch.serve_vllm ")
  log = tmp_path / "serve.log"
  cmd = argv(
    serve, {"--model=DIR": f"--model={made_tiny[0]}", "--port=8000": f"--port={free_port()}"}
  )
  t0 = time.time()
  with open(log, "w") as f:
    proc = subprocess.Popen(
      cmd, cwd=REPO, env=ENV, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
  try:
    ready = None
    while ready is None and proc.poll() is None and time.time() - t0 < 600:
      ready = re.search(r"vLLM serving .* at (http://\S+) ", log.read_text())
      time.sleep(0.5)
    assert ready, f"not up (exit {proc.poll()}):\n{log.read_text()[-4000:]}"
    url = ready.group(1)
    print(f"\nlaunch.serve_vllm up at {url} after {time.time() - t0:.1f}s")
    assert [m["id"] for m in _get_json(url + "/v1/models")["data"]] == ["policy"]

    # The Composition-RL section's command reads a parquet file: 30 rows of the shipped set.
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(l) for l in open(os.path.join(REPO, AIME))][:30]
    parquet = tmp_path / "math12k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    subs = {
      "--source=FILE": f"--source={AIME}",
      "--source=math12k.parquet": f"--source={parquet}",
      "--n=N": "--n=2",
      "--n=1000": "--n=2",
      "--out=OUT.jsonl": f"--out={tmp_path / 'out.jsonl'}",
      "--out=d2.jsonl": f"--out={tmp_path / 'd2.jsonl'}",
      "--url=URL": f"--url={url}",
      "--url=http://localhost:8000": f"--url={url}",
      "--model=Qwen2.5-32B-Instruct": "--model=policy",
    }  # the served name
    composes = readme("python -m launch.compose ")
    assert len(composes) == 2, composes
    for command in composes:
      cmd = argv(
        command,
        {k: v for k, v in subs.items() if k in shlex.split(command)},
        ["--max_tokens=48", "--concurrency=2"],
      )
      out = run(cmd)
      target = next(t.split("=", 1)[1] for t in cmd if t.startswith("--out="))
      with open(target + ".report.json") as f:
        report = json.load(f)
      assert (report["planned"], report["finished"]) == (2, 2), report
      assert report["this_run"]["requests"] >= 2 and "error" not in report["this_run"]
      assert "composed 2 of 2 planned" in out.stdout
  finally:
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(120)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
  assert proc.returncode == 0, log.read_text()[-4000:]
  assert "vLLM server stopped" in log.read_text()
  with pytest.raises((urllib.error.URLError, OSError)):
    _get_json(url + "/health", timeout=2)


def _small_run(*flags):
  """Flags that scale an arithmetic-task config down to a seconds-long run."""
  return [
    "--config.sft.steps=0",
    "--config.data.arithmetic.n_sft=4",
    "--config.data.arithmetic.n_train=16",
    "--config.data.arithmetic.n_heldout=4",
    "--config.eval.sampling.n=2",
    "--config.rl.loop.prompts_per_step=4",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.loop.max_response_len=16",
    "--config.eval.sampling.max_tokens=16",
    "--config.export_hf=False",
    "--config.reward_workers=1",
    *flags,
  ]


def _save_module(page: str, module: str, where) -> None:
  """The page's `# <module>.py` block saved as printed into the folder `where`."""
  [block] = [b for b in _python_blocks(page) if b.startswith(f"# {module}.py")]
  (where / f"{module}.py").write_text(block)


def _run_readme_module(command_prefix: str, module: str, page: str, tmp_path):
  """The page's `# <module>.py` block saved as printed, on PYTHONPATH, and the command that
  names it run for one RL step; returns the run's work dir."""
  [command] = readme(command_prefix)
  _save_module(page, module, tmp_path)
  workdir = tmp_path / "run"
  env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  run(argv(command, extra=[f"--workdir={workdir}", *_small_run("--config.rl.steps=1")]), env=env)
  return workdir


@pytest.mark.slow
def test_grpo_on_your_model_your_data_your_reward(tiny_dirs, tmp_path):
  """The README's first example as printed: its my_reward.py (verl's form) on PYTHONPATH, a
  tiny HF model for the hub id, a parquet training file and a JSONL eval file with the columns
  the command names; its group size, learning rate and KL as given, one RL step of 2 prompts
  with short responses. The reward preflight passes on those rows before step 1."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  [command] = readme("python -m launch.train --config=configs/base.py --config.model.path=")
  _save_module("README.md", "my_reward", tmp_path)
  # the problems' own numbers are not their answers
  rows = [
    {
      "question": f"What is the sum of the first {n} positive integers?",
      "final_answer": str(n * (n + 1) // 2),
    }
    for n in range(2, 10)
  ]
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
  (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
  subs = {
    "--config.model.path=Qwen/Qwen2.5-0.5B-Instruct": f"--config.model.path={tiny_dirs['qwen3']}",
    "--config.data.train_path=train.parquet": f"--config.data.train_path={tmp_path / 'train.parquet'}",
    "--config.data.eval_paths=test.jsonl": f"--config.data.eval_paths={tmp_path / 'test.jsonl'}",
  }
  workdir = tmp_path / "run"
  flags = [
    f"--workdir={workdir}",
    "--config.rl.steps=1",
    "--config.rl.loop.prompts_per_step=2",
    "--config.rl.loop.max_response_len=8",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.eval.sampling.max_tokens=8",  # 8 samples a problem: the rollouts' programs
    "--config.data.chat_template=none",  # the tiny tokenizer has no chat template
    "--config.export_hf=False",
    "--config.reward_workers=1",
  ]
  env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  run(argv(command, subs, flags), env=env, timeout=300)
  summary = json.loads((workdir / "summary.json").read_text())
  assert (summary["method"], summary["steps"]) == ("rlvr", 1), summary
  assert sorted(summary["eval_after_rl"]) == ["test"], summary["eval_after_rl"]
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert row["verdict_scored"] == 2 * 8, row  # rl.loop.group_size=8 as printed
  assert "kl" in row, sorted(row)  # logged only with rl.learner.kl_beta > 0
  preflight = summary["preflight"]  # every row's gold answer scored, no probe did
  assert preflight["rows"] == preflight["gold_scored"] == 8, preflight
  assert not any(p["as_much_as_gold"] for p in preflight["probes"].values()), preflight


@pytest.mark.slow
def test_train_with_the_readme_method_from_outside_the_library(tmp_path):
  """docs/methods.md's my_methods.py block, saved as printed and put on PYTHONPATH."""
  workdir = _run_readme_module(
    "python -m launch.train --config=configs/tiny_rlvr.py --config.method=my_methods:make",
    "my_methods",
    "docs/methods.md",
    tmp_path,
  )
  summary = json.loads((workdir / "summary.json").read_text())
  assert (summary["method"], summary["steps"]) == ("twice", 1)
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert row["twice_groups"] == row["groups_kept"] == 4


@pytest.mark.slow
def test_train_with_the_readme_reward_from_outside_the_library(tmp_path):
  """docs/rewards.md's my_reward.py block, saved as printed and put on PYTHONPATH: every step
  and evaluation is scored by it (its rewards are 1, -0.1 or 0, each a verdict `scored`)."""
  workdir = _run_readme_module(
    "python -m launch.train --config=configs/tiny_rlvr.py --config.reward.domain=my_reward:score",
    "my_reward",
    "docs/rewards.md",
    tmp_path,
  )
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  responses = row["verdict_scored"]
  assert responses == 4 * 8 and row["verdict_fn_raised"] == row["verdict_fn_not_finite"] == 0
  assert -0.1 <= row["reward_mean"] <= 1.0
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["steps"] == 1 and "heldout" in summary["eval_after_rl"]
  # verl's and TRL's forms from the same block, summed with weights
  [summed] = readme(
    "python -m launch.train --config=configs/tiny_rlvr.py --config.reward.domain=my_reward:compute_score,"
  )
  workdir = tmp_path / "summed"
  env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  run(argv(summed, extra=[f"--workdir={workdir}", *_small_run("--config.rl.steps=1")]), env=env)
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert row["verdict_scored"] == 4 * 8 and row["reward_info_length"] > 0
  both = row["reward_fn_compute_score"] + 0.5 * row["reward_fn_format_reward"]
  assert row["reward_mean"] == pytest.approx(both, abs=1e-6)


@pytest.mark.slow
def test_train_with_the_readme_environment_from_outside_the_library(tmp_path):
  """docs/envs.md's my_env.py block, saved as printed and put on PYTHONPATH: every rollout and
  evaluation runs in it (an untrained policy never closes a call: one turn each)."""
  workdir = _run_readme_module(
    "python -m launch.train --config=configs/tiny_rlvr.py --config.env.name=my_env:make",
    "my_env",
    "docs/envs.md",
    tmp_path,
  )
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert row["turns_mean"] >= 1 and row["tool_calls_mean"] >= 0  # episode metrics: in an env
  # The block's environment answers as its comments say.
  sys.path.insert(0, str(tmp_path))
  try:
    import my_env
  finally:
    sys.path.remove(str(tmp_path))
  from rlvr import envs

  calc = my_env.make(envs.EnvConfig(name="my_env:make"))
  episode = envs.Episode("")
  assert calc.observe(episode, "so <calc>12*7</calc>") == " = 84"
  assert calc.observe(episode, "<calc>2**99</calc>") == " = ?" and episode.tool_calls == 2


@pytest.mark.slow
def test_tiny_tool_calls_the_python_tool(tmp_path):
  """configs/tiny_tool.py scaled down: a short SFT on worked solutions that call the tool,
  then one GRPO step whose episodes run blocks in the sandbox."""
  commands = readme("python -m launch.train --config=configs/tiny_tool.py")
  [command] = [c for c in commands if "init_from" not in c]
  [again] = {c for c in commands if "init_from" in c}  # docs/launch.md
  workdir = tmp_path / "run"
  flags = [
    "--config.sft.steps=150",
    "--config.data.arithmetic.n_sft=300",
    "--config.data.arithmetic.n_train=16",
    "--config.data.arithmetic.n_heldout=4",
    "--config.eval.sampling.n=2",
    "--config.rl.steps=1",
    "--config.rl.loop.prompts_per_step=4",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.log_samples_every=1",
    "--config.export_hf=False",
  ]
  run(argv(command, extra=[f"--workdir={workdir}", *flags]), timeout=900)
  [row] = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert row["tool_calls_mean"] > 0 and row["obs_tokens_frac"] > 0, row
  samples = [json.loads(l) for l in (workdir / "samples" / "step_0.jsonl").read_text().splitlines()]
  called = [s for s in samples if s["tool_calls"]]
  assert called and all(["env"] == [k for k, _ in s["spans"][1:2]] for s in called)
  assert all("```output" in s["spans"][0][1] for s in called)
  # The same RL again from the finished SFT: no SFT of its own
  subs = {
    "--config.workdir=workdir/tool_try": f"--config.workdir={tmp_path / 'again'}",
    "--config.sft.init_from=workdir/tiny_tool": f"--config.sft.init_from={workdir}",
  }
  out = run(argv(again, subs, extra=flags), timeout=900)  # n_sft: the same problems drawn
  assert f"SFT: reusing {workdir / 'sft' / 'model'} (sft.init_from)" in out.stdout
  assert not (tmp_path / "again" / "sft").exists()

  # ... and the same RL step as the run that trained the SFT (timings aside)
  def untimed(d):
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "time" not in k and k != "tokens_per_s"} for r in rows]

  assert untimed(tmp_path / "again") == untimed(workdir)


@pytest.mark.slow
def test_tiny_rlvr_lora_trains_adapters_and_exports_them(tmp_path):
  """configs/tiny_rlvr_lora.py scaled down: GRPO on adapters; the run exports the merged
  model and the adapter in PEFT's layout (which tests/model/test_peft_export.py loads in PEFT)."""
  [command] = set(readme("python -m launch.train --config=configs/tiny_rlvr_lora.py"))
  workdir = tmp_path / "run"
  flags = _small_run("--config.rl.steps=2", "--config.export_hf=True")
  flags.append("--config.checkpoint.export_every=1")  # policy_steps/step_1 during the run
  run(argv(command, extra=[f"--workdir={workdir}", *flags]))
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [0, 1]
  adapter = json.loads((workdir / "policy_adapter" / "adapter_config.json").read_text())
  assert (adapter["r"], adapter["lora_alpha"]) == (16, 32.0)
  assert os.path.isfile(os.path.join(adapter["base_model_name_or_path"], "config.json"))
  assert (workdir / "policy" / "model.safetensors").exists()
  for step in ("step_1", "step_2"):
    assert (workdir / "policy_steps" / step / "model.safetensors").exists()
    assert (workdir / "policy_adapter_steps" / step / "adapter_model.safetensors").exists()
  final = (workdir / "policy" / "model.safetensors").read_bytes()
  assert (workdir / "policy_steps" / "step_2" / "model.safetensors").read_bytes() == final
  # Step 1's exports load as they are: transformers reads the merged model, PEFT puts step
  # 1's adapter on the base it names, and the two compute the same logits.
  import torch
  from peft import PeftModel
  from transformers import AutoModelForCausalLM

  load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # noqa: E731
  step_1 = workdir / "policy_adapter_steps" / "step_1"
  base = json.loads((step_1 / "adapter_config.json").read_text())["base_model_name_or_path"]
  tokens = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
  with torch.no_grad():
    merged = load(workdir / "policy_steps" / "step_1")(tokens).logits
    adapted = PeftModel.from_pretrained(load(base), step_1)(tokens).logits
  torch.testing.assert_close(adapted, merged, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_composition_curriculum_at_embedded_scale(tmp_path):
  """Inline in the Composition-RL section; one step per depth stage."""
  [command] = readme("python -m launch.train --config=configs/tiny_composition.py")
  workdir = tmp_path / "run"
  run(
    argv(
      command,
      extra=[
        f"--workdir={workdir}",
        *_small_run("--config.rl.steps=2", "--config.composition.max_steps=1"),
      ],
    )
  )
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["method"] == "composition" and summary["depth_per_step"] == [1, 2]
  for phase in ("eval_before_rl", "eval_after_rl"):
    assert sorted(summary[phase]) == ["heldout_d1", "heldout_d2", "heldout_d3"]
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["depth"] for r in rows] == [1, 2]
  assert (workdir / "composition.png").exists()
