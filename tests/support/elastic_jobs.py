"""Start a Horovod elastic job the way users do: ``horovodrun --gloo`` with a host discovery script.

The discovery script prints ``OUT/hosts``; the job's scripts (tests/engine/scripts/elastic_hosts.py)
change that file to remove and add hosts while the job runs.
"""

import os
from collections import defaultdict

from helpers import BIN, PYTHON, run_bounded

# Each run of the discovery script appends to OUT/discovery-parents the command lines of the processes above it, up
# to the launcher: "|" before each, nearest first (engine fix 09-elastic-discovery-script-without-a-python-per-poll).
_ANCESTRY = """p=$PPID; chain=""
for _ in 1 2 3 4; do
  [ -r /proc/$p/cmdline ] || break
  chain="$chain|$(tr '\\0' ' ' < /proc/$p/cmdline)"
  case "$chain" in *horovodrun*) break ;; esac
  p=$(sed 's/.*) [A-Za-z] \\([0-9]*\\) .*/\\1/' /proc/$p/stat)
done
echo "$chain" >> {parents}
"""


def discovery(out, hosts):
    """Write ``out/hosts`` = ``hosts`` and an executable ``out/discover.sh`` printing it; its path. Each run also
    records what started it (``discovery_parents``)."""
    (out / "hosts").write_text(hosts)
    script = out / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {out / 'hosts'}\n" + _ANCESTRY.format(parents=out / "discovery-parents"))
    script.chmod(0o755)
    return script


def discovery_parents(out):
    """For each run of ``out``'s discovery script, the command lines of the processes between it and the launcher
    (the launcher's last), nearest first."""
    lines = (out / "discovery-parents").read_text().splitlines()
    return [line.split("|")[1:] for line in lines]


def clean_env(extra=None):
    """This environment without HOROVOD_* variables (a job in a job must not inherit its place), plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    return dict(clean, **(extra or {}))


def run_elastic(script, out, hosts, np_, min_np, max_np, extra=(), timeout=240, elastic_timeout=60, env=None):
    """Run ``horovodrun -np np_ --min-np min_np --max-np max_np --gloo python script out *extra`` with
    ``out/hosts`` = ``hosts`` printed by the discovery script; return the finished process
    (``run_bounded``: the whole group is killed after ``timeout`` s)."""
    argv = [
        str(BIN / "horovodrun"),
        *("-np", str(np_), "--min-np", str(min_np), "--max-np", str(max_np)),
        *("--elastic-timeout", str(elastic_timeout), "--host-discovery-script", str(discovery(out, hosts))),
        "--gloo",
        PYTHON,
        str(script),
        str(out),
        *extra,
    ]
    return run_bounded(argv, timeout, env=clean_env(env), cwd=out)


def last_generation(records):
    """The sample-log records of each (epoch, step) as finally trained, under in-process recovery: a step redone
    after a recovery is logged again, later, by every rank of the new size; the earlier records of it were rolled
    back. Asserts that every rank of that size logged it."""
    by_step = defaultdict(list)
    for r in records:
        by_step[(r["epoch"], r["step"])].append(r)
    final = {}
    for key, rs in by_step.items():
        rs.sort(key=lambda r: r["time"])
        size = rs[-1]["size"]
        final[key] = rs[-size:]
        assert sorted(r["rank"] for r in final[key]) == list(range(size)), (key, rs)
    return final


def assert_every_sample_once_per_epoch(records, epochs, samples, steps_per_epoch):
    """Every one of ``samples`` training samples once in each of ``epochs`` epochs, and the steps 1 ..
    ``epochs * steps_per_epoch`` each trained (their last generation, ``last_generation``)."""
    final = last_generation(records)
    for epoch in range(epochs):
        seen = [i for (e, _), rs in final.items() if e == epoch for r in rs for i in r["indices"]]
        assert sorted(seen) == list(range(samples)), f"epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct"
    assert sorted(s for _, s in final) == list(range(1, epochs * steps_per_epoch + 1))
