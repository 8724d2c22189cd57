"""hvdkit run on GPU machines, without a GPU: counting the GPUs the ranks see (CUDA_VISIBLE_DEVICES,
nvidia-smi, /proc), -np defaulting to one rank per GPU, and NCCL's variables reaching the ranks."""

import subprocess

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hvdkit import cli
from hvdkit.launcher import gpus, plan
from hvdkit.launcher.gpus import gpu_count, physical_gpus, visible_devices
from hvdkit.launcher.hosts import Host
from hvdkit.launcher.plan import build, default_num_proc
from hvdkit.launcher.spec import JobSpec

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None)
PY = "/venv/bin/python"
SMI_L = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)\n"
    "  MIG 1g.10gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
)


# -- CUDA_VISIBLE_DEVICES --------------------------------------------------------------------

INDEX = st.integers(0, 15).map(str)
UUID = st.from_regex(r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}", fullmatch=True)
ENTRIES = st.lists(st.one_of(INDEX, UUID), max_size=8)
STOPPERS = st.sampled_from(["-1", "", "x", "-3", "1.5", "GPU"])


@FAST
@given(ENTRIES, st.sampled_from([",", ", ", " ,"]))
def test_a_list_of_indices_and_uuids_reads_back_whole(entries, sep):
    value = sep.join(entries)
    assert visible_devices(value) == tuple(entries) or (not entries and visible_devices(value) == ())


@FAST
@given(ENTRIES.filter(bool), STOPPERS, ENTRIES)
@example(["0"], "-1", ["1"])
def test_the_list_ends_at_the_first_entry_that_is_not_a_device_as_in_cuda(before, stopper, after):
    assert visible_devices(",".join([*before, stopper, *after])) == tuple(before)


@pytest.mark.parametrize("value", ["", "-1", "none", "NONE", " ", "NoDevFiles", "-1,0"])
def test_empty_minus_one_and_none_mean_no_gpu(value):
    assert visible_devices(value) == ()
    assert gpu_count({"CUDA_VISIBLE_DEVICES": value}, physical=8) == 0


def test_an_unset_variable_limits_nothing():
    assert visible_devices(None) is None
    assert gpu_count({}, physical=4) == 4


def test_leading_zeros_name_the_same_index():
    assert visible_devices("00,01") == ("0", "1")


@FAST
@given(ENTRIES, st.integers(0, 8))
def test_the_count_never_exceeds_the_machines_gpus_nor_the_listed_devices(entries, found):
    n = gpu_count({"CUDA_VISIBLE_DEVICES": ",".join(entries)}, physical=found)
    assert 0 <= n <= min(found, len(entries))


@pytest.mark.parametrize(
    "value, found, want",
    [
        ("0,1", 4, 2),
        ("2", 4, 1),
        ("0,1,2,3", 2, 2),
        ("1,5,0", 2, 1),
        ("3", 2, 0),
        ("GPU-1234abcd", 2, 1),
        ("0,1", 0, 0),
    ],
)
def test_a_list_counts_the_gpus_it_names_that_exist(value, found, want):
    assert gpu_count({"CUDA_VISIBLE_DEVICES": value}, physical=found) == want


def test_the_machines_gpus_are_probed_only_when_the_variable_leaves_some():
    calls = []

    def probe():
        calls.append(1)
        return 3

    assert gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, physical=probe) == 0 and calls == []
    assert gpu_count({}, physical=probe) == 3 and calls == [1]


# -- nvidia-smi and /proc ---------------------------------------------------------------------


def test_nvidia_smi_dash_l_counts_gpu_lines_not_mig_lines():
    assert physical_gpus(smi=lambda args: SMI_L if args == ["-L"] else None, listdir=lambda d: 1 / 0) == 2


def test_without_nvidia_smi_the_drivers_proc_entries_count(tmp_path):
    for bus in ("0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"):
        (tmp_path / bus).mkdir()
    assert physical_gpus(smi=lambda args: None, proc_dir=str(tmp_path)) == 3


def test_no_nvidia_smi_and_no_driver_is_zero_gpus(tmp_path):
    assert physical_gpus(smi=lambda args: None, proc_dir=str(tmp_path / "absent")) == 0


def test_nvidia_smi_that_fails_or_is_missing_gives_none():
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 9, "NVIDIA-SMI has failed because it couldn't communicate\n", "")

    assert gpus.nvidia_smi(["-L"], which=lambda name: "/usr/bin/nvidia-smi", run=run) is None
    assert gpus.nvidia_smi(["-L"], which=lambda name: None) is None
    ok = subprocess.CompletedProcess([], 0, SMI_L, "")
    assert gpus.nvidia_smi(["-L"], which=lambda name: "/x/nvidia-smi", run=lambda argv, **kw: ok) == SMI_L


# -- -np default ----------------------------------------------------------------------------


def test_without_np_a_gpu_machine_runs_one_rank_per_gpu_and_says_so():
    assert default_num_proc((), cores=16, gpus=2) == (2, "2 rank(s) on this machine (one per GPU)")


def test_without_np_and_without_gpus_it_is_one_rank_per_core():
    n, why = default_num_proc((), cores=3, gpus=0)
    assert n == 3 and "one per CPU core" in why


def test_without_np_hosts_give_all_their_slots_whatever_the_gpus_here():
    n, why = default_num_proc((Host("a", 2), Host("b", 3)), cores=16, gpus=8)
    assert n == 5 and "one per slot of the 2 host(s)" in why


def test_hvdkit_run_dry_run_without_np_starts_one_rank_per_visible_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    for name in ("SLURM_JOB_NODELIST", "OMPI_MCA_orte_default_hostfile"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["run", "--dry-run", "--", "python", "-c", "pass"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[1:3] == ["-np", "2"]
    assert "no -np given: 2 rank(s) on this machine (one per GPU)" in err


def test_hvdkit_run_with_np_asks_for_no_gpus(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: pytest.fail("probed GPUs although -np was given"))
    assert cli.main(["run", "--dry-run", "-np", "3", "--", "python", "-c", "pass"]) == 0
    assert capsys.readouterr().out.split()[1:3] == ["-np", "3"]


# -- NCCL variables ----------------------------------------------------------------------------


def _exported(argv):
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-x"]


def test_the_launchers_nccl_variables_are_exported_to_every_rank():
    base = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0", "NCCLX": "no", "OTHER": "no", "PATH": "/bin"}
    argv = build(JobSpec(["python", "t.py"], 2), is_root=False, cores=2, python=PY, base_env=base).argv
    assert {"NCCL_DEBUG", "NCCL_IB_HCA"} <= set(_exported(argv))
    assert not {"NCCLX", "OTHER", "PATH"} & set(_exported(argv))  # PATH only for remote hosts


def test_nccl_variables_reach_remote_hosts_with_path():
    spec = JobSpec(["python", "t.py"], 4, hosts=(Host("n1", 2), Host("n2", 2)))
    argv = build(spec, is_root=False, cores=2, python=PY, base_env={"NCCL_DEBUG": "WARN", "PATH": "/bin"}).argv
    assert {"NCCL_DEBUG", "PATH"} <= set(_exported(argv))


def test_network_interface_sets_nccl_socket_ifname_for_the_ranks():
    spec = JobSpec(["python", "t.py"], 2, network_interface="eth1")
    built = build(spec, is_root=False, cores=2, python=PY, base_env={})
    assert built.env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert "NCCL_SOCKET_IFNAME" in _exported(built.argv)
    gloo = build(
        JobSpec(["python", "t.py"], 2, controller="gloo", network_interface="eth1"),
        is_root=False,
        cores=2,
        python=PY,
        base_env={},
    )
    assert gloo.env["NCCL_SOCKET_IFNAME"] == "eth1"  # horovodrun hands its environment to the ranks


@pytest.mark.parametrize("where", ["shell", "-x"])
def test_a_users_nccl_socket_ifname_wins_over_network_interface(where):
    base = {"NCCL_SOCKET_IFNAME": "ib0"} if where == "shell" else {}
    env = {"NCCL_SOCKET_IFNAME": "ib0"} if where == "-x" else {}
    built = build(
        JobSpec(["python", "t.py"], 2, network_interface="eth1", env=env),
        is_root=False,
        cores=2,
        python=PY,
        base_env=base,
    )
    assert built.full_env(base)["NCCL_SOCKET_IFNAME"] == "ib0"
    assert _exported(built.argv).count("NCCL_SOCKET_IFNAME") == 1


def test_without_network_interface_nccl_socket_ifname_is_not_set():
    assert (
        "NCCL_SOCKET_IFNAME"
        not in build(JobSpec(["python", "t.py"], 2), is_root=False, cores=2, python=PY, base_env={}).env
    )
    assert plan.NCCL_SOCKET_IFNAME == "NCCL_SOCKET_IFNAME"


def test_horovod_and_hvdkit_settings_of_the_launcher_reach_ranks_on_other_hosts():
    """Open MPI passes no variable to other hosts unless told (-x); horovodrun passes its environment on.
    A HOROVOD_FUSION_THRESHOLD set where `hvdkit run` starts must hold on every host's ranks."""
    spec = JobSpec(["python", "t.py"], 4, hosts=(Host("n1", 2), Host("n2", 2)))
    base = {
        "HOROVOD_FUSION_THRESHOLD": "0",
        "HOROVOD_CYCLE_TIME": "2",
        "HVDKIT_NUM_THREADS": "1",
        "HOROVODX": "no",
        "HOROVOD_RANK": "3",
        "HOROVOD_HOSTNAME": "elsewhere",
    }  # the last two: a launcher's own place in a job
    exported = set(_exported(build(spec, is_root=False, cores=2, python=PY, base_env=base).argv))
    assert {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HVDKIT_NUM_THREADS"} <= exported
    assert not {"HOROVODX", "HOROVOD_RANK", "HOROVOD_HOSTNAME"} & exported
