"""A Keras 2 habit on Keras 3: an optimizer config with `lr`. Every rank must stop with an error naming
`learning_rate`, and the job must end (no rank left waiting in a collective).
Usage: python hvd_keras_keras2_error.py
"""

import keras

import horovod.tensorflow.keras as hvd

hvd.init()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer({"class_name": "SGD", "config": {"lr": 0.01 * hvd.size()}})
model.compile(optimizer=opt, loss="mse")
print("unreachable: the optimizer was accepted", flush=True)
