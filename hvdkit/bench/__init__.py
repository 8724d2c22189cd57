"""``hvdkit bench``: the user's own benchmark of Horovod through hvdkit, where they run it.

``suite`` (sections and flags) runs each section as a real job (``jobs``) of the workers
``comm_bench``, ``train_bench``, ``keras_bench``, ``ckpt_bench``, ``zero_bench`` (``keras_overlap`` and
``gpu_bench`` run by hand); ``stats`` holds the timing arithmetic, ``report`` the goals, table,
plots and results.md. The project's own benchmark lab, which writes docs/benchmarks.md, is
``benchmarks/`` at the repository root (not installed; it builds on this package, never the reverse).
"""
