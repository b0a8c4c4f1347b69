"""Tool-integrated RL at embedded scale: the ~0.6M-parameter policy of configs/tiny_rlvr.py
on 2-step arithmetic over 2-digit operands ("Compute 47*86+12."), with a python tool it can
call (`env.name = "python_tool"`).

SFT shows it 1,000 worked solutions that copy the expression into a python block and box
the block's output; GRPO then trains it in episodes: it writes the block and "```output", the
block runs in the bubblewrap sandbox, the output comes back as observation tokens (no
loss on them), and it writes the answer. The same run with `--config.env.name=single_turn`
is the same policy without the tool (it must make up the output).

  python -m launch.train --config=configs/tiny_tool.py
"""

from configs import tiny_rlvr


def get_config():
  c = tiny_rlvr.get_config()
  c.workdir = "workdir/tiny_tool"
  c.data.arithmetic.max_operand = 99  # 2-digit operands (3-digit ones the policy does not
  # learn to copy into the block in this SFT budget)
  c.data.arithmetic.answer = "tool"  # SFT solutions call the tool and box its output
  c.data.arithmetic.n_sft = 1000
  c.sft.steps = 800
  c.rl.steps = 60
  c.rl.loop.max_prompt_len = 40  # "Compute 928+492-993." would be 27 tokens with the template
  c.rl.loop.max_response_len = 48  # one turn: the block (about 30 tokens), or the answer
  c.env.name = "python_tool"
  c.env.max_turns = 3
  c.env.max_tool_calls = 2
  c.env.max_total_tokens = 160  # prompt + turns + outputs
  c.env.observation_max_tokens = 24
  c.env.workers = 4
  c.eval.sampling.max_tokens = 48  # per turn, as in training
  return c
