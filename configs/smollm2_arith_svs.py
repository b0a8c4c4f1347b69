"""SvS on a real pretrained model: configs/smollm2_arith.py with configs/tiny.py's SvS recipe.

The same SmolLM2-135M-Instruct job (its GGUF file, a vLLM CPU server, 2-step arithmetic with
`\\boxed{}` answers, rewards for correctness only), with online self-play inside every
step: the model turns its own correct solutions of underperforming problems back into
problems, and those it solves at a mixed rate join the update. As in configs/tiny.py, the
SFT warm start also teaches the synthesis task on the same problems (worked solution ->
the problem it solves), so it trains twice as long. Figures against plain GRPO:
docs/results.md#svs-on-smollm2-135m-instruct.

  python -m launch.train --config=configs/smollm2_arith_svs.py
"""

from configs import smollm2_arith


def get_config():
  c = smollm2_arith.get_config()
  c.workdir = "workdir/smollm2_arith_svs"
  c.method = "svs"
  c.svs.template = "arithmetic"  # rlvr.data.tasks.arithmetic.INVERSE_TEMPLATE
  c.svs.syntheses_per_solution = 2  # G_v (paper: 8); each synthesis is solved G = 4 times
  c.data.arithmetic.inverse_pairs = True
  c.sft.steps = 2 * smollm2_arith.get_config().sft.steps  # two tasks
  c.rl.loop.max_prompt_len = 160  # a synthesis prompt carries a whole response (<= 64)
  return c
