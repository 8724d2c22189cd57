"""Elastic training by restart: ``rules`` (pure: which world to launch, when to grow, the summary),
``discovery`` (which hosts are there now) and ``loop`` (attempts, host polling, stop requests)."""
