"""Embedded default: SvS at embedded scale, a ~0.6M-parameter model on 2 CPU cores.

configs/tiny_rlvr.py (plain GRPO on 2-step arithmetic) plus SvS inside every
step. The SFT warm start also teaches the synthesis task on the same 500
problems (worked solution -> the problem it solves, our short arithmetic
prompt), so the tiny policy can turn its correct solutions back into
problems; it trains twice as long because it learns two tasks.

  python -m launch.train --config=configs/tiny.py

summary.json reports the synthetic problems accepted per step and the buffer
types; metrics.jsonl adds `svs_accepted_consistent`, the accepted synthetic
problems whose true answer really is the original's (a diagnostic only this
task can compute; training never sees it).
"""

from configs import tiny_rlvr

SFT_STEPS = 800


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny"
  c.method = "svs"
  c.svs.template = "arithmetic"  # rlvr.data.tasks.arithmetic.INVERSE_TEMPLATE
  c.data.arithmetic.inverse_pairs = True
  c.sft.steps = SFT_STEPS
  c.svs.syntheses_per_solution = 2  # G_v (paper: 8); each synthesis is solved G = 8 times
  c.rl.steps = 60
  c.rl.learner.learning_rate = 1e-4  # tiny_rlvr's 2e-4 dipped 7 points in the first 20 SvS steps
  c.rl.loop.max_prompt_len = 64  # synthesis prompts carry a whole solution (57-61 tokens)
  c.rl.learner.pack = True  # sequences of 40-80 tokens padded to 112; packed into
  c.rl.learner.pack_len = 256  # rows of 256, the update takes a third less time
  return c
