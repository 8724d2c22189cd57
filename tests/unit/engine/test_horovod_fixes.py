"""hvdkit/engine/recipe/horovod-fixes: every engine fix says what it cures and which test proves it, stays in its
owner's number range, and the whole series applies in order to a pristine Horovod sdist.

The recipe's own edits of Horovod's build files (hvdkit/engine/recipe/horovod-build) are patches too: each says why
and when, is hashed into the wheel key of the builds that apply it, and applies cleanly to the sdist with exactly its
edit.

The mechanism itself (hvdkit/engine/recipe/apply-horovod-fixes.sh) is tested on small fake trees: it stops naming a
patch that does not apply, and its fix level changes with any patch's content (the wheel cache key).
"""

import os
import re
import shutil
import subprocess
import sys
import tarfile
from fnmatch import fnmatch

import pytest
from helpers import ROOT

RECIPE = ROOT / "hvdkit" / "engine" / "recipe"
FIXES = RECIPE / "horovod-fixes"
APPLY = RECIPE / "apply-horovod-fixes.sh"
PATCHES = sorted(FIXES.glob("*.patch"))
HOROVOD_VERSION = "0.28.1"
# Number range -> the folders its patches may touch (one owner per range, see the fixes README).
RANGES = [
    (range(1, 10), ("horovod/runner/", "horovod/ray/")),  # the launch side: horovodrun and Ray
    (range(10, 40), ("horovod/tensorflow/", "horovod/common/")),
    (range(40, 70), ("horovod/_keras/", "horovod/tensorflow/keras/", "horovod/keras/")),
    (range(70, 90), ("horovod/torch/",)),
]

# The fixes that must change Horovod's C++ (a rebuild of the engine; the new fix level's wheel key makes it), and
# their C++ files: every other fix is Python only.
CXX_FIXES = {
    "17-elastic-worker-lost-while-ring-forms-fails-init.patch": ("horovod/common/operations.cc",),
    "18-common-reinit-keeps-fixed-settings.patch": ("horovod/common/parameter_manager.cc",),
    "20-common-mpi-controller-waits-without-spinning.patch": ("horovod/common/mpi/mpi_controller.cc",),
    "80-torch-synchronize-waits-without-spinning.patch": (
        "horovod/torch/handle_manager.h",
        "horovod/torch/handle_manager.cc",
        "horovod/torch/mpi_ops_v2.cc",
    ),
}


def header(text):
    """``{Cures, Upstream, Test}`` from the lines before the first ``--- `` line."""
    head = text.split("\n--- ", 1)[0]
    return dict(re.findall(r"^(Cures|Upstream|Test): *(.*\S)", head, re.MULTILINE))


def touched_files(text):
    return re.findall(r"^\+\+\+ b/(\S+)", text, re.MULTILINE)


def test_there_is_at_least_the_fix_that_names_the_fix_level():
    assert [p.name for p in PATCHES if p.name.startswith("01-")] == ["01-check-build-prints-fix-level.patch"]


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_says_what_it_cures_where_upstream_and_which_test_proves_it(patch):
    fields = header(patch.read_text())
    assert set(fields) == {"Cures", "Upstream", "Test"}, f"{patch.name}: header lines missing, got {fields}"
    assert len(fields["Cures"]) > 20, f"{patch.name}: the Cures line should name the upstream symptom"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_the_test_each_patch_names_exists(patch):
    node = header(patch.read_text())["Test"].split()[0]
    path, _, rest = node.partition("::")
    test_file = ROOT / path
    assert path.startswith("tests/") and test_file.is_file(), f"{patch.name}: no test file {path}"
    name = rest.split("::")[-1].split("[")[0]
    assert name.startswith("test_"), f"{patch.name}: '{node}' names no test function"
    assert re.search(rf"^\s*def {re.escape(name)}\(", test_file.read_text(), re.MULTILINE), (
        f"{patch.name}: {path} defines no {name}"
    )


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_touches_only_python_files_of_its_number_range(patch):
    number = int(patch.name.split("-", 1)[0])
    allowed = next((folders for numbers, folders in RANGES if number in numbers), None)
    assert allowed, f"{patch.name}: number {number} is in no owner's range"
    files = touched_files(patch.read_text())
    assert files, f"{patch.name}: no '+++ b/...' line (paths must be a/horovod/... b/horovod/...)"
    for f in files:
        assert f.endswith(".py") or f in CXX_FIXES.get(patch.name, ()), (
            f"{patch.name}: {f} is not Python (fixes are Python only, but for those CXX_FIXES names)"
        )
        assert f.startswith(allowed), f"{patch.name}: {f} is outside {allowed}"
        if number < 40 and f.startswith("horovod/tensorflow/keras/"):
            pytest.fail(f"{patch.name}: {f} belongs to the keras range 40-69")


@pytest.fixture(scope="module")
def pristine_sdist(tmp_path_factory):
    """The Horovod sdist from PyPI (pip's cache makes a second download quick), extracted."""
    where = tmp_path_factory.mktemp("sdist")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-d",
        str(where),
        f"horovod=={HOROVOD_VERSION}",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("pip download of the Horovod sdist timed out (no route to PyPI?)")
    if done.returncode != 0:
        pytest.skip(f"the Horovod {HOROVOD_VERSION} sdist could not be fetched from PyPI: {done.stderr.strip()[-300:]}")
    with tarfile.open(where / f"horovod-{HOROVOD_VERSION}.tar.gz") as tar:
        tar.extractall(where, filter="data")
    return where / f"horovod-{HOROVOD_VERSION}"


def apply(src, fixes=None):
    env = None if fixes is None else {"HVDKIT_HOROVOD_FIXES": str(fixes), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", str(APPLY), str(src)], capture_output=True, text=True, env=env, timeout=120)


def test_every_patch_applies_in_order_to_the_pristine_sdist_and_the_marker_names_them(pristine_sdist, tmp_path):
    src = tmp_path / "horovod"
    shutil.copytree(pristine_sdist, src)
    done = apply(src)
    assert done.returncode == 0, done.stderr
    marker = (src / "horovod" / "hvdkit_fixes.py").read_text()
    level = subprocess.run(["bash", str(APPLY), "--level"], capture_output=True, text=True, check=True).stdout.strip()
    assert f'LEVEL = "{level}"' in marker
    names = re.findall(r'^    "(\S+)",$', marker, re.MULTILINE)
    assert names == [p.stem for p in PATCHES]
    assert not list(src.rglob("*.rej")) and not list(src.rglob("*.orig"))
    # The fix level line is what fix 01 adds to check-build.
    assert "hvdkit engine fixes: {hvdkit_fixes}" in (src / "horovod" / "runner" / "launch.py").read_text()


def fake_tree(tmp_path, text="one\ntwo\n"):
    src = tmp_path / "src"
    (src / "horovod").mkdir(parents=True)
    (src / "horovod" / "x.py").write_text(text)
    return src


def write_patch(folder, name, old, new):
    folder.mkdir(exist_ok=True)
    body = f"Cures: demo\nUpstream: none\nTest: none\n\n--- a/horovod/x.py\n+++ b/horovod/x.py\n@@ -1,2 +1,2 @@\n {old[0]}\n-{old[1]}\n+{new}\n"
    (folder / name).write_text(body)


def test_a_patch_that_does_not_apply_stops_the_build_and_is_named(tmp_path):
    src, fixes = fake_tree(tmp_path), tmp_path / "fixes"
    write_patch(fixes, "10-good.patch", ("one", "two"), "TWO")
    write_patch(fixes, "11-stale.patch", ("one", "two"), "zwei")  # its context is gone after 10
    done = apply(src, fixes)
    assert done.returncode != 0
    assert "fix 11-stale does not apply" in done.stderr
    assert "applied 10-good" in done.stderr
    assert not (src / "horovod" / "hvdkit_fixes.py").exists()


def test_patches_apply_in_name_order(tmp_path):
    src, fixes = fake_tree(tmp_path), tmp_path / "fixes"
    write_patch(fixes, "20-second.patch", ("one", "2a"), "2b")
    write_patch(fixes, "10-first.patch", ("one", "two"), "2a")
    done = apply(src, fixes)
    assert done.returncode == 0, done.stderr
    assert (src / "horovod" / "x.py").read_text() == "one\n2b\n"
    assert '"10-first",\n    "20-second",' in (src / "horovod" / "hvdkit_fixes.py").read_text()


def test_the_fix_level_changes_with_the_content_of_any_patch(tmp_path):
    def level(fixes):
        env = {"HVDKIT_HOROVOD_FIXES": str(fixes), "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            ["bash", str(APPLY), "--level"], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()

    fixes = tmp_path / "fixes"
    write_patch(fixes, "10-a.patch", ("one", "two"), "TWO")
    first = level(fixes)
    write_patch(fixes, "10-a.patch", ("one", "two"), "Two")
    assert re.fullmatch(r"hvdkit-fixes-[0-9a-f]{12}", first)
    assert level(fixes) != first


def test_the_build_script_applies_the_fixes_inside_the_recipe_and_keys_the_cache_on_them():
    text = (RECIPE / "build-horovod.sh").read_text()
    recipe = text.split("\n    # >>> recipe\n", 1)[1].split("\n    # <<< recipe\n", 1)[0]
    assert 'apply-horovod-fixes.sh" "$src"' in recipe
    key_line = next(line for line in text.splitlines() if line.startswith("key="))
    assert "fixes=" in key_line


def test_the_recipe_and_the_fixes_exist_once_inside_the_package_and_the_script_only_wraps_it():
    scripts = ROOT / "scripts"
    assert not list(scripts.rglob("*.patch")) and not (scripts / "apply-horovod-fixes.sh").exists()
    wrapper = (scripts / "build-horovod.sh").read_text()
    assert 'exec bash "$root/hvdkit/engine/recipe/build-horovod.sh" "$@"' in wrapper
    assert "pip wheel" not in wrapper and "CMAKE_CXX_STANDARD" not in wrapper
    setup_cfg = (ROOT / "setup.cfg").read_text()
    assert "recipe/*.sh" in setup_cfg and "recipe/horovod-fixes/*.patch" in setup_cfg
    assert "recipe/horovod-build/*.patch" in setup_cfg  # the build patches: `hvdkit engine install` needs them


def key_of(argv, env=None):
    done = subprocess.run(
        ["bash", *map(str, argv), "--key"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_make_setup_and_hvdkit_engine_install_share_one_cache_key():
    from hvdkit import engine

    by_setup = key_of([ROOT / "scripts" / "build-horovod.sh"])
    assert re.fullmatch(rf".*/horovod-{HOROVOD_VERSION}-[0-9a-f]{{20}}", by_setup)
    assert str(engine.wheel_dir(sys.executable)) == by_setup
    # The key follows the fixes: a different patch set is a different wheel.
    assert key_of([RECIPE / "build-horovod.sh"], {"HVDKIT_HOROVOD_FIXES": "/nonexistent"}) != by_setup


def test_the_packaged_recipe_defaults_to_the_horovod_version_pinned_in_constraints():
    pin = re.search(r"^horovod==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE).group(1)
    assert re.search(
        rf"^HOROVOD_VERSION=\$\{{HOROVOD_VERSION:-{re.escape(pin)}\}}$",
        (RECIPE / "build-horovod.sh").read_text(),
        re.MULTILINE,
    )


GPU_PATCHES = sorted((ROOT / "hvdkit" / "engine" / "recipe" / "horovod-fixes-gpu").glob("*.patch"))


@pytest.mark.parametrize("patch", GPU_PATCHES, ids=lambda p: p.name)
def test_each_gpu_patch_says_what_it_cures_and_touches_only_gpu_code(patch):
    """The GPU series (C++ of the CUDA code paths) is applied by GPU builds only, after the whole series."""
    text = patch.read_text()
    assert {"Cures", "Upstream", "Test"} <= set(header(text)), header(text)
    assert touched_files(text) and all("cuda" in f for f in touched_files(text)), touched_files(text)


def test_the_gpu_series_applies_after_the_whole_series(pristine_sdist, tmp_path):
    src = tmp_path / "horovod"
    shutil.copytree(pristine_sdist, src)
    assert apply(src).returncode == 0
    for patch in GPU_PATCHES:
        with open(patch) as f:
            done = subprocess.run(
                ["patch", "-d", str(src), "-p1", "--forward", "--batch"],
                stdin=f,
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert done.returncode == 0, f"{patch.name}: {done.stdout}{done.stderr}"
    assert 'dlopen("libcuda.so.1"' in (src / "horovod" / "torch" / "cuda_util.cc").read_text()


# The recipe's own edits of Horovod's build files (hvdkit/engine/recipe/horovod-build): 0N every build, 1N-gpu GPU
# builds; the script applies and hashes each group by these globs, so a patch named otherwise would be in no key.
BUILD = RECIPE / "horovod-build"
BUILD_PATCHES = sorted(BUILD.glob("*.patch"))
EVERY_BUILD, GPU_BUILDS = "0[1-9]-*.patch", "1[0-9]-gpu-*.patch"


def build_header(text):
    head = text.split("\n--- ", 1)[0]
    return dict(re.findall(r"^(Why|When): *(.*\S)", head, re.MULTILINE))


def test_there_are_the_build_patches_of_every_build_and_of_gpu_builds():
    assert [p.name for p in BUILD_PATCHES] == [
        "01-cxx17-for-framework-headers.patch",
        "02-tensorflow-without-xla-mpi-ops.patch",
        "10-gpu-cuda-cxx17.patch",
        "11-gpu-torch-python-include-from-sysconfig.patch",
        "12-gpu-torch-cxx20.patch",
    ]


@pytest.mark.parametrize("patch", BUILD_PATCHES, ids=lambda p: p.name)
def test_each_build_patch_says_why_and_when_and_one_cache_key_hashes_it(patch):
    text = patch.read_text()
    fields = build_header(text)
    assert set(fields) == {"Why", "When"}, f"{patch.name}: header lines missing, got {fields}"
    gpu = fnmatch(patch.name, GPU_BUILDS)
    assert gpu != fnmatch(patch.name, EVERY_BUILD), f"{patch.name}: matches neither or both of the script's globs"
    assert fields["When"].startswith("GPU builds" if gpu else "every build"), fields["When"]
    files = touched_files(text)
    assert files and all(f.endswith("CMakeLists.txt") for f in files), f"{patch.name}: {files} are not build files"


def test_the_build_script_edits_the_sdist_only_by_the_build_patches_and_hashes_them_where_it_applies_them():
    text = (RECIPE / "build-horovod.sh").read_text()
    recipe = text.split("\n    # >>> recipe\n", 1)[1].split("\n    # <<< recipe\n", 1)[0]
    gpu = text.split("\n    # >>> gpu recipe\n", 1)[1].split("\n    # <<< gpu recipe\n", 1)[0]
    assert f'for p in "$here"/horovod-build/{EVERY_BUILD}; do' in recipe
    for patch in BUILD_PATCHES:
        if fnmatch(patch.name, GPU_BUILDS):
            assert patch.stem in gpu and patch.stem not in recipe, patch.name
    assert "sed -i" not in text and '>> "$src' not in text  # no edit of the sdist besides the patches
    recipe_hash = text.split("\nrecipe_hash=", 1)[1].split(" | sha256sum", 1)[0]
    gpu_hash = text.split("gpu_recipe=", 1)[1].split(" | sha256sum", 1)[0]
    assert f'"$here"/horovod-build/{EVERY_BUILD}' in recipe_hash and "cat " in recipe_hash
    assert f'"$here"/horovod-build/{GPU_BUILDS}' in gpu_hash and GPU_BUILDS not in recipe_hash


def test_the_wheel_key_follows_the_content_of_a_build_patch_and_a_missing_folder_is_named(tmp_path):
    copy = tmp_path / "recipe"
    shutil.copytree(RECIPE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    script = copy / "build-horovod.sh"
    key = key_of([script])
    assert key == key_of([RECIPE / "build-horovod.sh"])  # the key names no folder
    first = copy / "horovod-build" / BUILD_PATCHES[0].name
    first.write_text(first.read_text().replace("Why: ", "Why:  ", 1))
    assert key_of([script]) != key
    shutil.rmtree(copy / "horovod-build")
    done = subprocess.run(
        ["bash", str(script), "--key"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 1
    assert f"no build patches in {copy / 'horovod-build'}: this hvdkit's engine recipe is incomplete" in done.stderr


# What each build patch does to the pristine file: the whole file is compared, so a patch that did more fails.
BUILD_EDITS = {
    "CMakeLists.txt": [("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")],
    "horovod/torch/CMakeLists.txt": [
        ("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
        (
            "from distutils.sysconfig import get_python_inc; print(get_python_inc())",
            "import sysconfig; print(sysconfig.get_paths()['include'])",
        ),
    ],
    "horovod/tensorflow/CMakeLists.txt": [
        ('list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n', "")
    ],
    "horovod/common/ops/cuda/CMakeLists.txt": [("set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)")],
}
TORCH_CXX20 = "set_property(TARGET ${PYTORCH_TARGET_LIB} PROPERTY CXX_STANDARD 20)\n"


def test_the_build_patches_apply_cleanly_after_the_fixes_and_make_exactly_their_edits(pristine_sdist, tmp_path):
    src = tmp_path / "horovod"
    shutil.copytree(pristine_sdist, src)
    assert apply(src).returncode == 0
    for patch in BUILD_PATCHES:
        with open(patch) as f:
            done = subprocess.run(
                ["patch", "-d", str(src), "-p1", "--forward", "--batch", "--fuzz=0"],
                stdin=f,
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert done.returncode == 0, f"{patch.name}: {done.stdout}{done.stderr}"
        assert "Hunk" not in done.stdout, f"{patch.name} applies only with an offset: {done.stdout}"
    for name, edits in BUILD_EDITS.items():
        expected = (pristine_sdist / name).read_text()
        for old, new in edits:
            assert expected.count(old) == 1, (name, old)
            expected = expected.replace(old, new)
        if name == "horovod/torch/CMakeLists.txt":
            expected += TORCH_CXX20
        assert (src / name).read_text() == expected, name
    assert not list(src.rglob("*.rej")) and not list(src.rglob("*.orig"))
