"""``python -m benchmarks network``: allreduce sweep and training steps across two hosts joined by a shaped link.

    python -m benchmarks network [--link 1gbit --link 10gbit --link unlimited] [--quick] [--out DIR] [--docs PAGE]

``make bench-network`` runs it. The two hosts are network namespaces on this machine joined by a
veth pair with sshd in each (``benchmarks.netns``); ``tc ... tbf`` limits each direction of the
link to the rate. Every job is started from host a with ``hvdkit run -np 2 -H a:1,b:1
--network-interface hvd0``, as a user starts a two-host job, so MPI's TCP transport and Gloo's
sockets carry every byte over the link. Per rate, in this order (so one slow spell of the shared
machine hits one rate's whole set): a raw TCP stream (``benchmarks.tcp_stream``, the reference),
the allreduce sweep over MPI and over Gloo (``hvdkit.bench.comm_bench``), and the training-step
comparison (``hvdkit.bench.train_bench``, with fp16 and what ``compression="auto"`` picks). Then
Horovod's latency settings (cycle time, response cache, fusion threshold) on one host and across
the first shaped link, and hvdkit's chosen settings against Horovod's defaults at 1 Gbit/s;
settings are process-wide, so each is its own job, interleaved A B A B. Needs root (namespaces,
mounts, tc). The ranks run hvdkit's own (installed) workers; the TCP stream's two ends run this
package, with the repository root on their PYTHONPATH.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from hvdkit.bench.jobs import Suite, busy_warning, machine, publish, run_bench_job, say
from hvdkit.bench.stats import Samples, interleaved
from hvdkit.core.errors import ConfigError
from hvdkit.core.horovod_settings import HOROVOD_DEFAULTS  # Horovod 0.28.1's: a job setting them runs as plain Horovod

from . import docs, env_with_root
from . import network_report as report
from .netns import NIC, TwoHosts, format_rate, missing_tools, parse_rate

__all__ = ["RATES", "HOROVOD_DEFAULTS", "LATENCY", "check_ready", "run_network", "main"]

RATES = ("1gbit", "10gbit", "unlimited")
SIZES = [4 << 10, 256 << 10, 4 << 20, 16 << 20]
QUICK_SIZES = [4 << 10, 256 << 10]
TCP_PORT = 5201
MB = 1 << 20


def _with(**changes):
    env = dict(HOROVOD_DEFAULTS)
    env.update({f"HOROVOD_{k.upper()}": str(v) for k, v in changes.items()})
    return env


# Latency settings: (label, environment). Each changes one thing from Horovod's defaults, except
# "hvdkit defaults", which sets nothing and so runs with what hvdkit.core.runtime sets.
LATENCY = (
    ("horovod defaults", dict(HOROVOD_DEFAULTS)),
    ("hvdkit defaults", {}),
    ("cycle 0.5 ms", _with(cycle_time=0.5)),
    ("cycle 0.2 ms", _with(cycle_time=0.2)),
    ("cycle 0.1 ms", _with(cycle_time=0.1)),
    ("cycle 0 (no sleep)", _with(cycle_time=0)),
    ("cache off", _with(cache_capacity=0)),
    ("fusion 4 MB", _with(fusion_threshold=4 * MB)),
)
QUICK_LATENCY = LATENCY[:2]
# Jobs per setting (interleaved A B C .. A B C): a job's step median moves 10-40 % between jobs even on
# a quiet machine, so one job per setting cannot tell a 1 % loss of step throughput from noise.
LATENCY_REPS = 3
# The settings timed per place (the one-host MPI job times them all).
SUBSETS = {
    "one_host_mpi": (
        "horovod defaults",
        "hvdkit defaults",
        "cycle 0.1 ms",
        "cycle 0 (no sleep)",
        "cache off",
        "fusion 4 MB",
    ),
    "one_host_gloo": ("horovod defaults", "hvdkit defaults", "cycle 0.2 ms"),
    "link": ("horovod defaults", "hvdkit defaults", "cycle 0 (no sleep)"),
}


class Network:
    """The two hosts, the jobs run across them, and the one-host jobs they are compared with."""

    def __init__(self, out, hosts, quick, python=None):
        self.out, self.hosts, self.quick = out, hosts, quick
        self.local = Suite(out, 2, quick, python)  # one-host jobs (latency on one host)
        self.python, self.hvdkit = self.local.python, self.local.hvdkit

    def job(self, name, worker, *extra, gloo=False, env=None, timeout=900):
        """Run one worker on 2 ranks, one per host, started from host a; its JSON result."""
        path = os.path.join(self.out, "jobs", f"{name}.json")
        xs = [f"MASTER_ADDR={self.hosts.addresses[0]}", f"GLOO_SOCKET_IFNAME={NIC}"]
        xs += [f"{k}={v}" for k, v in (env or {}).items()]
        a, b = self.hosts.names
        run = [
            self.hvdkit,
            "run",
            "-np",
            "2",
            *(["--gloo"] if gloo else []),
            "-H",
            f"{a}:1,{b}:1",
            "--network-interface",
            NIC,
            *[arg for x in xs for arg in ("-x", x)],
            "--",
            self.python,
            "-m",
            f"hvdkit.bench.{worker}",
            path,
            *(["--quick"] if self.quick else []),
            *extra,
        ]
        return run_bench_job(
            name, self.hosts.argv_on(0, run), path, env, timeout, shown=run, error=ConfigError, where=" across hosts"
        )

    def tcp_once(self, seconds):
        """Bits/s of one raw TCP stream from host a to host b."""
        h, env = self.hosts, env_with_root()  # benchmarks is not installed: whatever the working directory
        recv = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                h.ns[1],
                self.python,
                "-m",
                "benchmarks.tcp_stream",
                "recv",
                h.addresses[1],
                str(TCP_PORT),
            ],
            stdout=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        try:
            if recv.stdout.readline().strip() != "READY":
                raise ConfigError("the TCP stream receiver on host b did not start")
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.ns[0],
                    self.python,
                    "-m",
                    "benchmarks.tcp_stream",
                    "send",
                    h.addresses[1],
                    str(TCP_PORT),
                    "--seconds",
                    str(seconds),
                ],
                check=True,
                timeout=60 + seconds,
                stdin=subprocess.DEVNULL,
                env=env,
            )
            line = recv.stdout.readline()
            recv.wait(timeout=30)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
        return json.loads(line)["bits_per_s"]

    def tcp(self, reps, seconds):
        s = Samples(self.tcp_once(seconds) for _ in range(reps))
        return {
            "median_bits_per_s": s.median,
            "spread": s.spread,
            "samples_bits_per_s": s.values,
            "seconds_each": seconds,
        }

    def rate(self, text):
        """One link rate: shape, then the TCP reference, both sweeps and the training comparison."""
        bits = parse_rate(text)
        self.hosts.shape(bits)
        tag = format_rate(bits)
        say(f"link {tag}: {self.hosts.qdisc(0).strip()}")
        sizes = [str(n) for n in (QUICK_SIZES if self.quick else SIZES)]
        out = {
            "rate_bits_per_s": bits,
            "qdisc": self.hosts.qdisc(0).strip(),
            "tcp": self.tcp(1 if self.quick else 3, 0.5 if self.quick else 2.0),
        }
        say(f"link {tag}: raw TCP {out['tcp']['median_bits_per_s'] / 1e9:.2f} Gbit/s")
        # Fewer, shorter samples than on one host: every variant crosses the link, and a 4 KB
        # allreduce there takes milliseconds on a busy machine.
        comm = ("--sizes", *sizes, *(() if self.quick else ("--reps", "3", "--max-iters", "20")))
        out["comm_mpi"] = self.job(f"net-{tag}-comm_mpi", "comm_bench", *comm)
        out["comm_gloo"] = self.job(f"net-{tag}-comm_gloo", "comm_bench", *comm, gloo=True)
        out["train"] = self.job(
            f"net-{tag}-train", "train_bench", "--fp16", "--auto", *(() if self.quick else ("--reps", "7"))
        )
        return out

    def settings_jobs(self, settings, reps, place, extra):
        """Each (label, env) as its own job, interleaved over ``reps``: {label: [results]}.

        ``place``: ``one_host_mpi``, ``one_host_gloo`` (jobs on this host) or a link (across the hosts).
        """
        runs = {label: [] for label, _ in settings}
        for rep, (label, env) in interleaved(settings, reps):
            name = f"{place}-{label}-{rep}".replace(" ", "_").replace("(", "").replace(")", "").replace(".", "_")
            if place.startswith("one_host"):
                runs[label].append(self.local.job(name, "train_bench", *extra, env=env, gloo=place.endswith("gloo")))
            else:
                runs[label].append(self.job(name, "train_bench", *extra, env=env))
        return runs

    def latency(self, link_text, tuned=None):
        """Step time and 4 KB allreduce time per Horovod setting, on one host and across the link.

        ``--quick`` runs no jobs of its own: it reads the two settings of ``tuned``'s runs.
        """
        link = f"link_{format_rate(parse_rate(link_text))}"
        if self.quick:
            return {
                "settings": dict(QUICK_LATENCY),
                link: {label: _latency_row(rs) for label, rs in tuned["runs"].items()},
            }
        out = {"settings": dict(LATENCY)}
        self.hosts.shape(parse_rate(link_text))
        for place in ("one_host_mpi", "one_host_gloo", link):
            subset = SUBSETS.get("link" if place == link else place)
            settings = [(label, env) for label, env in LATENCY if subset is None or label in subset]
            runs = self.settings_jobs(settings, LATENCY_REPS, place, ("--only", "hvdkit", "--reps", "5"))
            out[place] = {label: _latency_row(rs) for label, rs in runs.items()}
        return out

    def tuned(self, link_text, reps):
        """hvdkit's settings against Horovod's defaults on the link: step times, fp16 and auto's pick."""
        self.hosts.shape(parse_rate(link_text))
        settings = (("horovod defaults", dict(HOROVOD_DEFAULTS)), ("hvdkit defaults", {}))
        runs = self.settings_jobs(
            settings,
            reps,
            f"tuned_{format_rate(parse_rate(link_text))}",
            ("--only", "hvdkit", "hvdkit_fp16", "--auto", *(() if self.quick else ("--reps", "5"))),
        )
        return {"link": link_text, "runs": runs, "summary": report.tuned_summary(runs)}


def _latency_row(results):
    step = Samples(r["variants"]["hvdkit"]["median_s"] for r in results)
    lat = Samples(r["allreduce_4k_s"] for r in results)
    single = Samples(r["variants"]["single"]["median_s"] for r in results)
    spread = max(r["variants"]["hvdkit"]["spread"] for r in results)
    idle = Samples(r.get("idle_cpu", float("nan")) for r in results)
    return {
        "step_s": step.median,
        "step_spread": spread,
        "allreduce_4k_s": lat.median,
        "idle_cpu": idle.median,
        "single_s": single.median,
        "step_vs_single": step.median / single.median,
    }


def _stop_on_sigterm():
    """SIGTERM raises SystemExit, so the hosts are closed (namespaces, sshd, qdiscs) on the way out."""

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def check_ready(rates, page=None):
    """Errors before anything starts: known rates, the docs page's markers, root and the tools."""
    for r in rates:
        parse_rate(r)
    if page:
        docs.check_page(page, docs.NETWORK)
    missing = missing_tools()
    if missing:
        raise ConfigError(
            "python -m benchmarks network needs " + ", ".join(missing) + " (run as root; make setup installs the tools)"
        )


def run_network(out, rates=RATES, quick=False, page=None, tuned_reps=2):
    """The network section; returns the results (also written to ``out``/results.json and, with
    ``page``, its bench:network section)."""
    check_ready(rates, page)
    _stop_on_sigterm()
    t0 = time.perf_counter()
    os.makedirs(os.path.join(out, "jobs"), exist_ok=True)
    results = {"machine": machine(), "quick": quick, "ranks": 2, "hosts": 2, "rates": list(rates)}
    busy = busy_warning(results["machine"]["load_average_at_start"][0], results["machine"]["cores"])
    if busy and not quick:
        say(busy)
    shaped = next((r for r in rates if parse_rate(r) is not None), rates[0])
    with TwoHosts(prefix="hvdb") as hosts:
        net = Network(out, hosts, quick)
        say(f"hosts {', '.join(hosts.names)} ({', '.join(hosts.addresses)}) over {NIC}; results go to {out}")
        results["links"] = {format_rate(parse_rate(r)): net.rate(r) for r in rates}
        results["tuned"] = net.tuned(shaped, 1 if quick else tuned_reps)
        results["latency"] = net.latency(shaped, results["tuned"])
        results["host_names"] = list(hosts.names)
    results["leftovers"] = hosts.leftovers()
    publish(results, out, report, t0)
    if page:
        plots = [os.path.join(out, name) for name in report.PLOTS]
        docs.write_results(page, docs.NETWORK, report.markdown, results, plots)
    return results


def main(argv=None):
    """``python -m benchmarks network``; the exit code."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks network",
        description="The allreduce sweep, training steps and Horovod's latency settings across two emulated hosts "
        "joined by a shaped link (root; make bench-network).",
    )
    p.add_argument(
        "--out",
        default="build/bench-network",
        help="folder for results.json, results.md and the plots (default: build/bench-network)",
    )
    p.add_argument(
        "--link",
        action="append",
        default=None,
        metavar="RATE",
        help="rate to shape the hosts' link to, e.g. 1gbit, 10gbit, 500mbit, unlimited "
        f"(repeatable; default: {', '.join(RATES)})",
    )
    p.add_argument(
        "--quick", action="store_true", help="every job once on tiny sizes: checks the section, measures nothing"
    )
    p.add_argument(
        "--docs",
        default=None,
        metavar="PAGE",
        help="also rewrite the bench:network section of this Markdown page (docs/benchmarks.md)",
    )
    args = p.parse_args(argv)
    run_network(args.out, tuple(args.link or RATES), args.quick, args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
