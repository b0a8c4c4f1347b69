"""Where the repository and the tests' helpers are, for a test in any folder of tests/.

The helpers (echo_env, the workers, run_copies, ...) live in tests/ itself, which conftest.py
puts on sys.path; a process a test starts gets it through PYTHONPATH."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
