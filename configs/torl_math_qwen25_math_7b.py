"""ToRL (arXiv 2503.23383) at paper scale: Qwen2.5-Math-7B base trained with GRPO to call a
python tool mid-solution, on math problems given by path.

`configs.base.paper`'s GRPO settings (lr 1e-6, clip 0.2 / 0.28, token-mean loss, no KL,
vLLM sampling, MATH-500 + AIME held out) with ToRL's tool settings: the python tool in
the bubblewrap sandbox, at most C = 1 tool call per response (ToRL's main setting; its
ablation raises it), a failed call shows the error's last line, no loss on tool output,
128 prompts x 16 samples per step. Lengths fit the model's 4,096 positions: a prompt of
at most 1,024 tokens, then up to 3,072 for every turn and tool output together.

  python -m launch.train --config=configs/torl_math_qwen25_math_7b.py \\
      --config.model.path=/path/to/Qwen2.5-Math-7B \\
      --config.data.train_path=/path/to/torl_28k.parquet \\
      --config.sampler.urls=http://10.0.0.2:8000,http://10.0.0.3:8000

  python bench/plan.py --config=configs/torl_math_qwen25_math_7b.py --devices=8
"""

from configs import base

# Our wording of a tool-integrated instruction (ToRL prompts the base model to mix
# reasoning with programs and box the answer).
INSTRUCTION = (
  "Reason step by step; you may run Python by writing a ```python block followed by "
  "```output, and you will see what it prints. Put your final answer within \\boxed{}."
)


def get_config():
  c = base.paper("torl_math_qwen25_math_7b", steps=300)
  c.data.instruction = INSTRUCTION
  c.data.chat_template = "none"  # a base model: the prompt as plain text
  c.rl.loop.prompts_per_step = 128
  c.rl.loop.group_size = 16
  c.rl.learner.ppo_mini_batch_size = 128  # one optimizer step per rollout
  c.rl.loop.max_prompt_len = 1024
  c.rl.loop.max_response_len = 3072  # per turn; the episode budget below caps the sum
  c.env.name = "python_tool"
  c.env.max_tool_calls = 1  # ToRL's C
  c.env.max_turns = 2  # the block's turn and the one after its output
  c.env.max_total_tokens = 4096  # Qwen2.5-Math-7B's positions
  c.env.observation_max_tokens = 512
  c.env.workers = 32  # tool calls at once on the learner host
  c.eval.sampling.max_tokens = 3072
  return c
