"""SvS: Qwen2.5-32B on DAPO-17k (600 steps), the SvS paper's settings.

GRPO hyper-parameters as the RLVR baseline (METHODS.md: lr 1e-6, 256 x 8,
clip 0.2 / 0.28, dual-clip 3, no KL); SvS: underperforming 12.5%..50%, G_v 8
syntheses per correct response, synthesis reward band 12.5%..62.5%, type-2
groups kept only with mixed rewards. Ablations: configs/svs_ablations.py.

  python -m launch.train --config=configs/svs_dapo17k_qwen25_32b.py \
      --config.model.path=/path/to/hf_model --config.data.train_path=/path/to/train.parquet \
      --config.sampler.urls=http://10.0.0.2:8000 --workdir=runs/svs_dapo17k_qwen25_32b
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/svs_dapo17k_qwen25_32b"
  c.method = "svs"
  c.model.path = ""                     # required: HF dir of the base model
  c.data.kind = "files"
  c.data.train_path = "../shared/data/dapo_math_17k.parquet"          # required: verl parquet / jsonl
  c.data.eval_paths = ["../shared/data/math_aime_eval.jsonl"]
  c.sampler.kind = "vllm"
  c.rl.steps = 600
  c.reward = {"extraction": "boxed", "integer_answers": True, "format_bonus": 0.0,
              "timeout_s": 5.0}
  c.eval.sampling = {"n": 32, "seeds": (0,), "temperature": 1.0, "top_p": 0.7,
                     "max_tokens": 8192, "batch_prompts": 256}
  return c
