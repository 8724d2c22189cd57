"""hvdkit in any environment: its wheel in a new virtualenv outside the repo, the engine by one command.

As a cluster user does it: build hvdkit's wheel, make a venv under a temporary folder, install the
frameworks pinned by constraints.txt and the wheel, run `hvdkit engine install` (the recipe ships in
the wheel; the engine wheel `make setup` cached is a cache hit), `hvdkit doctor`, and a training
script that lives in the temporary folder on 2 ranks with `hvdkit run`. Nothing of the repo is on
that venv's path.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, run_bounded

pytestmark = [pytest.mark.dist, pytest.mark.timeout(1800)]
FRAMEWORKS = ["torch", "tensorflow-cpu", "keras", "numpy", "mpi4py"]

TRAIN = '''
"""Linear regression on 2 ranks, written by the test outside the repo: y = x @ (1..8)."""
import json, sys
import torch
import horovod, hvdkit, hvdkit.torch as hk

topo = hk.init()
torch.manual_seed(100 + topo.rank)  # ranks start apart: only the broadcast makes them equal
x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
model = torch.nn.Linear(8, 1)
opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
hk.broadcast_state(model, opt)
start = [p.detach().clone() for p in model.parameters()]
shard = slice(topo.rank * 256, (topo.rank + 1) * 256)
losses = []
for _ in range(40):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
    loss.backward()
    opt.step()
    losses.append(loss.item())
# One process on the whole batch from the same start: what the 2 ranks must equal (averaged gradients).
ref = torch.nn.Linear(8, 1)
with torch.no_grad():
    for p, s in zip(ref.parameters(), start):
        p.copy_(s)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for _ in range(40):
    ref_opt.zero_grad()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
json.dump({
    "rank": topo.rank, "size": topo.size, "losses": losses,
    "params": [v for p in model.parameters() for v in p.detach().flatten().tolist()],
    "reference": [v for p in ref.parameters() for v in p.detach().flatten().tolist()],
    "hvdkit": hvdkit.__file__, "horovod": horovod.__file__,
}, open(f"{sys.argv[1]}/rank{topo.rank}.json", "w"))
'''


def user_env(venv):
    """The environment of a user whose shell has only their venv and the system on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {
        **env,
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "PYTHONUNBUFFERED": "1",
    }


def run(argv, env, cwd, timeout=600):
    started = time.monotonic()
    done = run_bounded([str(a) for a in argv], timeout, env=env, cwd=str(cwd))
    seconds = time.monotonic() - started
    print(f"install-anywhere: {seconds:.1f} s for {' '.join(Path(str(a)).name for a in argv[:4])}", flush=True)
    return done, seconds


def must(done, what):
    assert done.returncode == 0, (
        f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    return done


def build_wheel(dist):
    """hvdkit's wheel, built from a copy of the sources (the build writes nothing into the repo)."""
    src = dist.parent / "hvdkit-src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "hvdkit", src / "hvdkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, src]
    must(run(argv, None, dist.parent)[0], "pip wheel of hvdkit")
    (wheel,) = dist.glob("hvdkit-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new venv outside the repo with the pinned frameworks and hvdkit's wheel; the seconds each step took."""
    home = tmp_path_factory.mktemp("user")
    (home / "dist").mkdir()
    times = {}
    started = time.monotonic()
    wheel = build_wheel(home / "dist")
    times["hvdkit wheel"] = time.monotonic() - started
    venv = home / "venv"
    must(run([sys.executable, "-m", "venv", venv], None, home)[0], "python -m venv")
    env = user_env(venv)
    # --no-compile: Python compiles what it imports; compiling every file of torch and TensorFlow up
    # front is most of an install's time on 2 cores.
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-compile"]
    # As scripts/setup.sh: mpi4py compiled against the system Open MPI (pip keeps the built wheel).
    done, times["frameworks"] = run(
        [*pip, "-c", ROOT / "constraints.txt", "--no-binary", "mpi4py", *FRAMEWORKS], env, home, 900
    )
    must(done, "pip install of the frameworks")
    done, times["hvdkit"] = run([*pip, wheel], env, home)
    must(done, "pip install of the hvdkit wheel")
    return {"home": home, "venv": venv, "env": env, "wheel": wheel, "times": times}


@pytest.fixture(scope="module")
def engine(venv):
    """`hvdkit engine install` twice in the new venv: the output and seconds of each."""
    argv = [venv["venv"] / "bin" / "hvdkit", "engine", "install"]
    first, first_s = run(argv, venv["env"], venv["home"])
    must(first, "the first hvdkit engine install")
    second, second_s = run(argv, venv["env"], venv["home"])
    must(second, "the second hvdkit engine install")
    venv["times"].update({"engine install (first)": first_s, "engine install (second)": second_s})
    return first.stderr, second.stderr


def test_the_hvdkit_wheel_carries_the_engine_recipe_and_every_fix_with_the_scripts_executable(venv):
    patches = sorted(p.name for p in (ROOT / "hvdkit" / "engine" / "recipe" / "horovod-fixes").glob("*.patch"))
    with zipfile.ZipFile(venv["wheel"]) as wheel:
        names = set(wheel.namelist())
        for script in ("build-horovod.sh", "apply-horovod-fixes.sh"):
            info = wheel.getinfo(f"hvdkit/engine/recipe/{script}")
            assert (info.external_attr >> 16) & stat.S_IXUSR, f"{script} lost its executable bit in the wheel"
    assert len(patches) >= 16
    assert {f"hvdkit/engine/recipe/horovod-fixes/{p}" for p in patches} <= names
    installed = next((venv["venv"] / "lib").glob("python3*/site-packages/hvdkit/engine/recipe/apply-horovod-fixes.sh"))
    assert os.access(installed, os.X_OK)  # the recipe runs it directly on a cache miss


def test_engine_install_in_a_new_venv_is_a_cache_hit_on_the_wheel_make_setup_built(venv, engine):
    first, _ = engine
    key = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-horovod.sh"), "--key"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
    ).stdout.strip()
    assert f"using cached wheel {key}/horovod-" in first, first
    assert "no cached wheel" not in first and "installed from the cached wheel (cache hit)" in first
    assert "check-build" in first  # a new engine in this venv is checked once


def test_a_second_engine_install_skips_check_build_when_the_installed_engine_is_unchanged(engine):
    _, second = engine
    assert "already installed for key" in second and "already installed and checked, nothing to do" in second, second
    assert "check-build (" not in second and "using cached wheel" not in second


def test_doctor_in_the_new_venv_confirms_the_engine_its_frameworks_and_the_fix_level_hvdkit_ships(venv, engine):
    from hvdkit.engine import fix_level

    done, venv["times"]["doctor --no-smoke"] = run(
        [venv["venv"] / "bin" / "hvdkit", "doctor", "--no-smoke"], venv["env"], venv["home"]
    )
    must(done, "hvdkit doctor")

    def row(name):  # doctor prints f"  {name:<26} {value}"
        found = [
            line[2:].removeprefix(name).strip() for line in done.stdout.splitlines() if line.startswith(f"  {name} ")
        ]
        assert len(found) == 1, done.stdout
        return found[0]

    assert row("python").endswith(f"({venv['venv']}/bin/python)")
    assert [row(f"horovod built with {part}") for part in ("PyTorch", "TensorFlow", "MPI", "Gloo")] == ["yes"] * 4
    assert row("horovod engine fixes").startswith(f"{fix_level()} (")
    assert done.stdout.rstrip().endswith("all checks passed")


def test_a_training_script_outside_the_repo_trains_on_two_ranks_in_the_new_venv(venv, engine):
    home, bin_ = venv["home"], venv["venv"] / "bin"
    (home / "train.py").write_text(TRAIN)
    (home / "out").mkdir()
    argv = [bin_ / "hvdkit", "run", "-np", "2", "--", bin_ / "python", home / "train.py", home / "out"]
    done, venv["times"]["2-rank training"] = run(argv, venv["env"], home)
    must(done, "hvdkit run -np 2")
    ranks = [json.loads((home / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["size"] for r in ranks] == [2, 2]
    for r in ranks:  # the venv's own hvdkit and engine, nothing from the repo
        assert Path(r["hvdkit"]).is_relative_to(venv["venv"]) and Path(r["horovod"]).is_relative_to(venv["venv"])
    assert ranks[0]["params"] == ranks[1]["params"]  # bitwise: broadcast start, averaged gradients
    assert ranks[0]["params"] == pytest.approx(ranks[0]["reference"], abs=1e-5)  # = one process, whole batch
    assert ranks[0]["params"][:8] == pytest.approx(list(range(1, 9)), abs=0.05)
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0] / 100
    print("install-anywhere seconds:", {k: round(v, 1) for k, v in venv["times"].items()})


def test_a_cache_miss_without_mpi_headers_or_cmake_names_their_debian_packages_and_changes_nothing(
    venv, engine, tmp_path
):
    tools = tmp_path / "bin"  # the system's tools except the MPI compiler wrapper and cmake
    tools.mkdir()
    for source in ("/usr/bin", "/bin"):
        for entry in os.scandir(source):
            if entry.name not in ("mpicc", "cmake") and not (tools / entry.name).exists():
                (tools / entry.name).symlink_to(entry.path)
    site = next((venv["venv"] / "lib").glob("python3*/site-packages"))
    stamp = site / ".hvdkit-horovod-key"
    stamp.unlink()  # the engine must be reinstalled, and the cache below is empty: a build
    record = next(site.glob("horovod-*.dist-info/RECORD")).read_bytes()
    env = {**venv["env"], "PATH": f"{venv['venv'] / 'bin'}:{tools}", "HVDKIT_WHEEL_CACHE": str(tmp_path / "empty")}
    done, _ = run([venv["venv"] / "bin" / "hvdkit", "engine", "install"], env, venv["home"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "hvdkit engine: error: missing: mpicc (the Open MPI headers; Debian package libopenmpi-dev), cmake (the build "
        "system; Debian package cmake). Install them: apt-get install -y libopenmpi-dev cmake"
    )
    assert next(site.glob("horovod-*.dist-info/RECORD")).read_bytes() == record  # the engine is untouched
