"""Parameter helpers the contract workers share: flatten, hash and compare models' parameters.

Framework modules are imported by the caller; these take a torch module or a Keras model.
"""

import hashlib

import numpy as np


def params_of(model):
    """A torch module's parameters and buffers, flattened into one tensor."""
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])


def max_param_diff(a, b):
    """Max |difference| between two torch modules' parameters."""
    return float((params_of(a).double() - params_of(b).double()).abs().max())


def params_digest(model):
    """SHA-256 of a torch module's parameters and buffers (as float64): equal digests mean equal values."""
    return hashlib.sha256(params_of(model).double().numpy().tobytes()).hexdigest()


def weights_of(model):
    """A Keras model's weights, flattened into one float64 array."""
    return np.concatenate([np.ravel(w).astype(np.float64) for w in model.get_weights()])


def weights_digest(model):
    """SHA-256 of a Keras model's weights: equal digests mean bitwise-equal weights."""
    return hashlib.sha256(weights_of(model).tobytes()).hexdigest()


def max_weight_diff(a, b):
    """Max |difference| between two Keras models' weights."""
    return float(np.max(np.abs(weights_of(a) - weights_of(b))))


def keras_mlp(seed=0, hidden=(16,), inputs=8, outputs=4):
    """A small Keras MLP (tanh hidden layers of ``hidden`` widths) whose weights come from ``seed``."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(width, activation="tanh") for width in hidden]
    return keras.Sequential([keras.Input((inputs,)), *layers, keras.layers.Dense(outputs)])


def keras_clone(model, **shape):
    """A new ``keras_mlp(**shape)`` holding ``model``'s weights."""
    twin = keras_mlp(0, **shape)
    twin.set_weights(model.get_weights())
    return twin
