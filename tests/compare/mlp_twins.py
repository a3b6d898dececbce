"""The mint MLP of tests/mindspore/models.py and its PyTorch twin with the same weights, for the
cross-framework compare tests. Loaded with `load_private` (tests/ has no packages)."""

import os

import torch

from private_modules import load_private

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindspore", "models.py")


def ms_models():
    return load_private("msprobe_ms_test_models", MODELS)


class TorchMLP(torch.nn.Module):
    """tests/mindspore/models.py MintMLP in PyTorch (same call order)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.nn.functional.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h)) + h
        return self.head(h)


def twins():
    """(MindSpore MintMLP, PyTorch TorchMLP holding the same weights, models module)."""
    models = ms_models()
    ms_net = models.build("mlp")
    pt_net = TorchMLP()
    ms_params = dict(ms_net.parameters_and_names())
    with torch.no_grad():
        for name, p in pt_net.named_parameters():
            p.copy_(torch.from_numpy(ms_params[name].asnumpy()))
    return ms_net, pt_net, models
