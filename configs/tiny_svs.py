"""The embedded default with SvS instead of plain GRPO.

The SFT warm start also teaches the inverse task (worked solution -> problem),
so the tiny policy can synthesize problems; the synthesis prompt is the short
arithmetic one it was trained on.

  python -m launch.train --config=configs/tiny_svs.py
"""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.workdir = "workdir/tiny_svs"
  c.method = "svs"
  c.svs_template = "arithmetic"
  c.data.arithmetic.inverse_pairs = True
  c.svs.syntheses_per_solution = 4
  c.rl.loop.max_prompt_len = 48        # synthesis prompts carry a whole solution
  return c
