"""Cluster files (SLURM batch scripts, MPIJob manifests, mpirun/horovodrun scripts, hostfiles) from one
job description: ``spec`` (RenderSpec, checked when made) and ``files`` (the renderers; pure).
``python -m hvdkit.launcher.render [DIR]`` rewrites the examples in DIR (default ``launch``)."""

from .files import render, save
from .spec import RenderSpec

__all__ = ["RenderSpec", "render", "save"]
