"""hvdkit's Horovod engine settings: chosen per transport, and a variable the user set always wins."""

from hvdkit.core import env
from hvdkit.core.horovod_settings import DEFAULTS, HOROVOD_DEFAULTS, engine_settings, transport


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
