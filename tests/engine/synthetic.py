"""Runs a script shaped like one of Horovod's public synthetic benchmarks on 2 ranks and checks what it printed."""

import re

from helpers import PYTHON, launcher_argv, run_bounded


def run_synthetic_benchmark(launcher, script, flags):
    """The output of ``script flags`` on 2 ranks started by ``launcher``, after checking it reports
    2 CPUs, two timed iterations and a positive total throughput, and no traceback."""
    proc = run_bounded(launcher_argv(launcher, 2) + [PYTHON, str(script), *flags], 600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{output[-6000:]}"
    assert "Number of CPUs: 2" in output
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", output)) == 2, output[-3000:]
    total = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+) \+-", output)
    assert total and float(total.group(1)) > 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output
