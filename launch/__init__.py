"""Command-line entry points: `python -m launch.<name>`.

Importing this package (which `python -m launch.<name>` does first, before any
entry point imports transformers or jax) keeps two library notices off the terminal.
"""

import logging
import os


def quiet_libraries() -> None:
  """Keeps transformers' "PyTorch was not found" advisory and jax's INFO line about the
  TPU backend it probes ("Unable to initialize backend 'tpu'") off the terminal.

  Only those: transformers' warnings and jax's warnings and errors still print, and a
  TRANSFORMERS_NO_ADVISORY_WARNINGS or JAX_LOGGING_LEVEL the user set is left alone.
  """
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  if "JAX_LOGGING_LEVEL" not in os.environ:
    # absl's handler prints INFO records; this logger's INFO lines are the backend probes.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


quiet_libraries()
