"""LoRA in RL at paper scale: what the two LoRA configs share (docs/lora.md).

Adapters of rank 32 (alpha 64, no dropout) on the attention and MLP projections; a sparse
model's experts are not adapted, so on Qwen3-30B-A3B they sit on attention only. The
learning rate is 10x full fine-tuning's (LoRA RL recipes run at 1e-5..1e-4). The base
stays in bf16, frozen; AdamW moments exist for the adapters only; the KL reference, when
on, is the base with the adapters off. vLLM serves the base with LoRA on and takes each
version as an adapter (`sampler.lora_adapters`; the server: launch/serve_vllm.py
--lora_rank=32).
"""


def apply(c, rank: int = 32):
  c.rl.learner.lora.rank = rank
  c.rl.learner.lora.alpha = 2.0 * rank
  c.rl.learner.lora.dropout = 0.0
  c.rl.learner.learning_rate = 10 * c.rl.learner.learning_rate
  # The adapters' gradient is contracted from the merged kernels' after the backward pass,
  # so it cannot be added into the accumulator layer by layer inside it.
  c.rl.learner.accumulate_in_backward = False
  c.sampler.lora_adapters = True
  return c
