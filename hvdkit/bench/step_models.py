"""The models the step breakdown trains (``hvdkit.bench.breakdown``), with their synthetic batches.

``resnet50`` (25.6 M parameters, 224x224 images, the GPU benchmark's) and ``bert`` (a BERT-base-sized
encoder: 30,522-token embedding, 12 layers of ``torch.nn.TransformerEncoderLayer`` with d_model 768,
12 heads, feed-forward 3072, sequences of 128, a 2-class head on the first token: 109 M parameters);
``mlp`` (``train_bench``'s 1024-wide model, 4.2 M) for CPU runs; ``tiny_mlp``, ``tiny_bert`` and
``tiny_resnet`` are the same code paths at toy sizes, for checks on CPU ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["MODELS", "ModelSpec", "resnet50"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and one rank's batch of it."""

    build: Callable[[], Any]
    batch: Callable[[int, Any, int], tuple[Any, Any]]  # (batch size, device, rank) -> (inputs, targets)
    default_batch: int
    describe: str


def _mlp(width: int, depth: int) -> torch.nn.Module:
    import torch

    from .train_bench import build_model

    return build_model(torch, width, depth)


def _features(width: int, classes: int) -> Callable[[int, Any, int], tuple[Any, Any]]:
    def batch(n, device, rank):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randn(n, width, generator=g).to(device), torch.randint(0, classes, (n,), generator=g).to(device)

    return batch


def resnet50(num_classes: int = 1000) -> torch.nn.Module:
    """ResNet-50 (He et al. 2015, bottleneck v1.5) in plain torch: 25.6 M parameters."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers, cin = [], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        *layers,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cin, num_classes),
    )


def _images(side: int, classes: int) -> Callable[[int, Any, int], tuple[Any, Any]]:
    def batch(n, device, rank):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        x = torch.randn(n, 3, side, side, generator=g).to(device)
        return x, torch.randint(0, classes, (n,), generator=g).to(device)

    return batch


def _resnet(num_classes: int, tiny: bool) -> torch.nn.Module:
    import torch.nn as nn

    if not tiny:
        return resnet50(num_classes)
    return nn.Sequential(  # the same layer kinds, a handful of them
        nn.Conv2d(3, 8, 3, 1, 1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    )


def _encoder(vocab: int, d_model: int, layers: int, heads: int, ff: int, seq: int) -> torch.nn.Module:
    """A BERT-like classifier: token and position embeddings, ``TransformerEncoder``, a head on token 0."""
    import torch
    import torch.nn as nn

    class Encoder(nn.Module):  # here: torch is imported only when a model is built
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d_model)
            self.positions = nn.Parameter(torch.zeros(seq, d_model))
            layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, 2)

        def forward(self, ids):
            return self.head(self.encoder(self.tokens(ids) + self.positions)[:, 0])

    return Encoder()


def _token_ids(vocab: int, seq: int) -> Callable[[int, Any, int], tuple[Any, Any]]:
    def batch(n, device, rank):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        ids = torch.randint(0, vocab, (n, seq), generator=g).to(device)
        return ids, torch.randint(0, 2, (n,), generator=g).to(device)

    return batch


MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec(
        lambda: _resnet(1000, False), _images(224, 1000), 64, "ResNet-50, 224x224, 25.6 M parameters"
    ),
    "bert": ModelSpec(
        lambda: _encoder(30522, 768, 12, 12, 3072, 128),
        _token_ids(30522, 128),
        32,
        "BERT-base-sized encoder (d_model 768, 12 layers, 12 heads, seq 128), 109 M parameters",
    ),
    "mlp": ModelSpec(lambda: _mlp(1024, 4), _features(1024, 10), 128, "MLP 1024 x 4 (train_bench), 4.2 M parameters"),
    "tiny_mlp": ModelSpec(lambda: _mlp(64, 2), _features(64, 10), 8, "MLP 64 x 2 (toy)"),
    "tiny_bert": ModelSpec(
        lambda: _encoder(100, 32, 2, 2, 64, 8), _token_ids(100, 8), 4, "encoder d_model 32, 2 layers (toy)"
    ),
    "tiny_resnet": ModelSpec(lambda: _resnet(10, True), _images(16, 10), 4, "2 convolutions + BatchNorm (toy)"),
}
