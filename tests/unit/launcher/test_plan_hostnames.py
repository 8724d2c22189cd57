"""Host names with a dot reach mpirun whole: Open MPI 4.1 cuts "w-0.svc" to "w-0" unless told not to
(seen with the image as two hosts: ssh then went to the short name and failed)."""

from hvdkit.launcher import plan
from hvdkit.launcher.hosts import parse_host_list
from hvdkit.launcher.spec import JobSpec


def argv_for(hosts):
    spec = JobSpec(command=["python", "train.py"], num_proc=2, hosts=parse_host_list(hosts))
    return list(plan.build(spec, is_root=False, cores=2).argv)


def test_dotted_host_names_keep_their_domain_in_mpirun():
    argv = argv_for("hvdkit-worker-0.hvdkit-worker.default.svc:1,hvdkit-worker-1.hvdkit-worker.default.svc:1")
    i = argv.index("orte_keep_fqdn_hostnames")
    assert argv[i - 1 : i + 2] == ["--mca", "orte_keep_fqdn_hostnames", "true"]


def test_short_host_names_get_no_extra_setting():
    assert "orte_keep_fqdn_hostnames" not in argv_for("node1:1,node2:1")
