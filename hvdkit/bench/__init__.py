"""``hvdkit bench``: the user's own benchmark of Horovod through hvdkit, where they run it.

``suite`` (its sections; the flags are ``hvdkit.cli.bench``'s) runs each section as a real job
(``jobs``) of the workers ``comm_bench``, ``train_bench``, ``keras_bench``, ``ckpt_bench``,
``zero_bench``; ``--breakdown`` runs ``step_sweep`` (jobs of ``breakdown`` on ``step_models``);
``stats`` holds the timing arithmetic, ``report`` the goals, table, plots and results.md. The
project's own benchmark lab, which writes docs/benchmarks.md, is ``benchmarks/`` at the repository
root (not installed; it builds on this package, never the reverse), with the tools run by hand:
``benchmarks.gpu_bench`` and ``benchmarks.keras_overlap``.
"""
