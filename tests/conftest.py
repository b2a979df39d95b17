import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# the tests check te_compile's numbers wherever cuDNN can serve a site: the cost model (serve="fastest",
# te_compile.cudnn.cost) is off unless a test asks for it (tests/test_cost.py)
os.environ["TE_COMPILE_SERVE"] = "always"
# likewise on a cuDNN version te_compile has not been checked on (te_compile.cudnn.versions keeps emitted
# score_mods there): the cuda suite is how a new version gets checked (tests/test_cudnn_versions.py covers the gate)
os.environ.setdefault("TE_COMPILE_UNCHECKED_CUDNN", "serve")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
