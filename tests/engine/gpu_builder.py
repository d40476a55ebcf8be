"""Where the tests run the GPU tree builder: on CUDA when there is a GPU, else on the CPU through
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 there)."""

import copy
import os

import torch


def models_for_gpu_builder(models):
    """(target, drafter) on the device the Triton builder runs on: copies on CUDA (the fixtures stay
    on the CPU for the other tests; the target's experts stacked for the fused MoE), the models
    themselves on the CPU."""
    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1"
        return models
    target, drafter = (model.to("cuda") for model in copy.deepcopy(models))
    return target.stack_experts("cuda"), drafter
