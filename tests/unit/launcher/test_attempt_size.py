"""An attempt's world size is decided once (``attempts.world_size``, through its Membership): the size the
restart loop records and prints is the size its ranks are started with (-np, HVDKIT_WORLD_SIZE), for a
fixed-size job on hosts with more slots than -np and for an elastic one."""

import io

from hvdkit.core import env
from hvdkit.launcher import job
from hvdkit.launcher.attempts import Attempt, FixedMembership, run_attempts, world_size
from hvdkit.launcher.elastic.discovery import FixedDiscovery
from hvdkit.launcher.elastic.loop import ElasticMembership, HostView
from hvdkit.launcher.elastic.rules import ElasticSettings
from hvdkit.launcher.execute import JobResult, RankProgress
from hvdkit.launcher.hosts import Host

A4 = (Host("a", 4),)
AB = (Host("a", 2), Host("b", 1))


def test_a_fixed_job_runs_its_np_and_an_elastic_one_every_slot_of_its_world():
    assert world_size(A4, 2) == 2 and world_size((), 3) == 3
    assert world_size(AB) == 3
    assert FixedMembership(A4, 2).size(A4) == 2
    view = HostView(FixedDiscovery(AB, "-H a:2,b:1"), check=lambda hosts, timeout: {})
    assert ElasticMembership(ElasticSettings(2, 1, 3), view).size(AB) == 3
    assert Attempt(A4, 0.0, ranks=2).size == 2 and Attempt(AB, 0.0).size == 3


def _sizes_started(membership, options, hosts):
    """(the size run_attempts recorded, the -np and HVDKIT_WORLD_SIZE of the spec its attempt was built from)."""
    attempts = job._Attempts(job.JobSpec(["python", "t.py"], 2, hosts=hosts), options, io.StringIO())
    started = []

    class Done:
        def progress(self):
            return RankProgress()

        def run(self, stop):
            return JobResult(0)

    def launch(world, size, attempt, changes):
        spec = attempts.spec_of(world, size, attempt, changes)
        started.append((spec.num_proc, spec.env[env.WORLD_SIZE]))
        return Done()

    history, _ = run_attempts(membership, launch, 0, log=lambda line: None)
    return [a.size for a in history.attempts], started


def test_the_recorded_size_is_the_size_the_ranks_are_started_with():
    assert _sizes_started(FixedMembership(A4, 2), job.RunOptions(), A4) == ([2], [(2, "2")])
    settings = ElasticSettings(3, 1, 3, discovery="-H a:2,b:1")
    view = HostView(FixedDiscovery(AB, "-H a:2,b:1"), check=lambda hosts, timeout: {})
    elastic = ElasticMembership(settings, view, log=lambda line: None)
    assert _sizes_started(elastic, job.RunOptions(elastic=settings), AB) == ([3], [(3, "3")])
