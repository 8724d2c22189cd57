"""The numbers both LR/clipping workers (lr_clipping_torch.py, lr_clipping_keras.py) train with;
tests/distributed/test_lr_and_clipping.py checks against the same LR and MAX_NORM."""

B = 4  # per-rank batch
LR = 0.1
MAX_NORM = 0.05  # well below the gradients' norms here, so every step is clipped
