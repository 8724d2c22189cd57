import io

from hvdkit.launch import doctor


def test_check_build_report_is_parsed():
    report = "Available Frameworks:\n    [X] TensorFlow\n    [X] PyTorch\n    [ ] MXNet\n\n" "Available Controllers:\n    [X] MPI\n    [ ] Gloo\n"
    assert doctor.check_build(report) == {"TensorFlow": True, "PyTorch": True, "MXNet": False, "MPI": True, "Gloo": False}


def test_a_missing_horovod_is_a_problem_with_the_fix(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda *names: None if "horovod" in names else real(*names))
    out = io.StringIO()
    problems = doctor.diagnose(smoke=False, out=out)
    assert any(p.startswith("horovod is missing: run `make setup`") for p in problems)
    assert "horovod                    MISSING" in out.getvalue()


def test_the_engine_fix_level_is_read_from_check_build_and_its_absence_means_unpatched():
    patched = "    Horovod v0.28.1:\n    hvdkit engine fixes: hvdkit-fixes-0123456789ab (3 fixes)\n\n    Available Frameworks:\n"
    assert doctor.engine_fix_level(patched) == "hvdkit-fixes-0123456789ab (3 fixes)"
    assert doctor.engine_fix_level("    Horovod v0.28.1:\n\n    Available Frameworks:\n") is None
    assert doctor.engine_fix_level("    hvdkit engine fixes: none (unpatched upstream engine)\n") is None
