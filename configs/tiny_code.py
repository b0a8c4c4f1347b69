"""Code at embedded scale: the tiny policy answers arithmetic with a program, run in the sandbox.

configs/tiny_rlvr.py with answers as programs: SFT teaches the worked steps followed by a
one-line python block that prints the result ("7*3=21. 12+21=33." then ```python print(33)
```), and GRPO's reward runs that block in the bubblewrap sandbox against the problem's
test (no input, the result on stdout; rlvr.rewards.code). The whole code path on 2 CPU
cores: extraction, sandbox, judge, verdicts in the samples files.

  python -m launch.train --config=configs/tiny_code.py
  python -m launch.train --config=configs/tiny_code.py --config.method=svs   # SvS on code

With method=svs the synthesis task is the arithmetic one (worked solution and program ->
the problem, taught by SFT), and a synthetic problem's solutions run against the original
problem's test, as SvS scores code.
"""

from configs import tiny_rlvr


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny_code"
  c.data.arithmetic.answer = "program"  # rlvr.data.tasks.arithmetic.as_program
  c.data.arithmetic.inverse_pairs = True  # SFT also teaches synthesis (used by method=svs)
  c.reward.domain = "code"  # programs against tests in the sandbox
  c.reward.code.workers = 4  # sandboxes at once (each mostly waits on process start-up)
  c.reward.integer_answers = False  # math matching is not used
  c.svs.template = "arithmetic"
  c.svs.syntheses_per_solution = 2
  c.sft.steps = 800  # two tasks (solving, synthesis), as configs/tiny.py
  c.rl.steps = 60
  c.rl.loop.max_prompt_len = 80  # synthesis prompts carry a whole solution and program
  c.rl.loop.max_response_len = 48
  c.rl.learner.learning_rate = 1e-4
  c.eval.sampling.max_tokens = 48
  return c
