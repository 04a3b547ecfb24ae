import os

import pytest
import torch

# Keep CPU tests quick and quiet on 2-core machines.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
