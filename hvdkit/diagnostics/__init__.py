"""Finding out what is wrong or slow: ``doctor`` (with ``doctor_gpu``: what is installed, what the engine
was built with, a 2-rank smoke test) and ``timeline`` (with ``timeline_plot``: where a Horovod
timeline's time went). Framework-free at import, like the launcher they sit on."""
