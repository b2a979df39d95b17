import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# the tests check te_compile's numbers wherever cuDNN can serve a site: the speed decision (serve="fastest",
# te_compile.tuning.rules) is off unless a test asks for it (tests/test_rules.py)
os.environ["TE_COMPILE_SERVE"] = "always"
# likewise on a cuDNN version te_compile has not been checked on (te_compile.cudnn.versions keeps emitted
# score_mods there): the cuda suite is how a new version gets checked (tests/test_cudnn_versions.py covers the gate)
os.environ.setdefault("TE_COMPILE_UNCHECKED_CUDNN", "serve")


def pytest_configure(config):
    """The CPU suite checks the cuDNN target's decisions with the cuDNN frontend's own validator (no GPU needed):
    without the frontend, stop at once with one message, not a mix of skips and failures."""
    try:
        import cudnn  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"the CPU suite needs the cuDNN frontend's Python package ({type(e).__name__}: {e}): "
            "pip install --no-deps 'nvidia-cudnn-frontend==1.32' (make test does; its validator runs on a CPU, "
            "its CUDA libraries are needed only on a GPU)") from None


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
