"""hvdkit's Horovod engine settings: chosen per transport, and a variable the user set always wins."""

from hvdkit.core import env
from hvdkit.core.horovod_settings import DEFAULTS, GPU_DEFAULTS, HOROVOD_DEFAULTS, engine_settings, transport


def test_a_job_started_by_horovodrun_gloo_gets_the_gloo_values_and_any_other_the_mpi_values():
    gloo = {env.HOROVOD_GLOO_RENDEZVOUS_ADDR: "10.0.0.1"}
    assert transport(gloo) == "gloo" and transport({"OMPI_COMM_WORLD_RANK": "0"}) == "mpi" and transport({}) == "mpi"
    assert engine_settings(gloo) == DEFAULTS["gloo"]
    assert engine_settings({}) == DEFAULTS["mpi"]


def test_hvdkit_shortens_horovods_cycle_below_one_millisecond():
    for values in DEFAULTS.values():
        assert set(values) <= set(HOROVOD_DEFAULTS)
        assert 0 < float(values[env.HOROVOD_CYCLE_TIME]) < float(HOROVOD_DEFAULTS[env.HOROVOD_CYCLE_TIME])


def test_a_horovod_variable_the_user_set_is_left_alone():
    mine = {env.HOROVOD_CYCLE_TIME: "5"}
    assert env.HOROVOD_CYCLE_TIME not in engine_settings(mine)
    assert engine_settings({**mine, env.HOROVOD_GLOO_RENDEZVOUS_ADDR: "x"}).get(env.HOROVOD_CYCLE_TIME) is None


def test_a_rank_training_on_a_gpu_gets_the_gpu_cycle_time_over_either_transport():
    # Measured on an H200 (docs/gpu.md, 2026-11-28): at Horovod's 1 ms (hvdkit's 0.5 ms over Gloo) the
    # NCCL step of ResNet-50 was 0.66x (0.54x) DDP's; at 5 ms 0.95x, with buckets 1.05x.
    gloo = {env.HOROVOD_GLOO_RENDEZVOUS_ADDR: "10.0.0.1"}
    for environ in ({}, gloo):
        assert engine_settings(environ, gpu=True)[env.HOROVOD_CYCLE_TIME] == GPU_DEFAULTS[env.HOROVOD_CYCLE_TIME] == "5"
        assert engine_settings(environ, gpu=False) == DEFAULTS[transport(environ)]
    assert env.HOROVOD_CYCLE_TIME not in engine_settings({env.HOROVOD_CYCLE_TIME: "1"}, gpu=True)


def test_an_empty_horovod_variable_gets_hvdkits_value_or_horovods_default_not_zero():
    # Horovod parses "" as 0: a 0 ms cycle (the background thread spins: 8.6 CPU-s per rank in 10 idle seconds,
    # measured), no tensor fusion, no response cache. A value the user set is still theirs, blanks are not values.
    blank = {env.HOROVOD_CYCLE_TIME: "", env.HOROVOD_FUSION_THRESHOLD: " ", env.HOROVOD_CACHE_CAPACITY: ""}
    assert engine_settings(blank) == {
        env.HOROVOD_CYCLE_TIME: DEFAULTS["mpi"][env.HOROVOD_CYCLE_TIME],
        env.HOROVOD_FUSION_THRESHOLD: HOROVOD_DEFAULTS[env.HOROVOD_FUSION_THRESHOLD],
        env.HOROVOD_CACHE_CAPACITY: HOROVOD_DEFAULTS[env.HOROVOD_CACHE_CAPACITY],
    }
    gloo = {**blank, env.HOROVOD_GLOO_RENDEZVOUS_ADDR: "10.0.0.1"}
    assert engine_settings(gloo)[env.HOROVOD_CYCLE_TIME] == DEFAULTS["gloo"][env.HOROVOD_CYCLE_TIME]
    assert engine_settings(blank, gpu=True)[env.HOROVOD_CYCLE_TIME] == GPU_DEFAULTS[env.HOROVOD_CYCLE_TIME]
    assert engine_settings({env.HOROVOD_FUSION_THRESHOLD: "0"}) == DEFAULTS["mpi"]  # "0" is a value: fusion off
