#!/usr/bin/env bash
# `make docker-test`: build docker/Dockerfile without a Docker engine and train 2 ranks in the image.
#   1. a Debian bookworm base from the Debian archive (mmdebstrap, cached outside the repository),
#      wrapped as an image by `FROM scratch` + `ADD base.tar /`;
#   2. docker/Dockerfile (two stages: the engine compiles in `build`, the image is `runtime`) built
#      by buildah (daemonless, as root) on that base, with this machine's CPU torch wheel and CA
#      bundle mounted into the build;
#   3. the image has no compiler and no headers; its default command (a 2-rank training as user
#      hvdkit) run in a container, checked by its JSON result line; then a 2-rank run as root,
#      `hvdkit doctor` (it must name the engine's fix level) and an ssh login like an MPI Operator
#      launcher's into a worker running the image's sshd.
# Prints the total duration and the image size. Needs root and Debian (it apt-installs buildah and
# mmdebstrap when missing).
#
# VARIANT=gpu (`make docker-test-gpu`) builds docker/Dockerfile.gpu instead (CUDA torch, the engine with
# NCCL compiled without a GPU) and checks it the same way, without a GPU: no compiler, 2 ranks of the
# example on CPU tensors, doctor, the ssh login; and that the engine has NCCL.
#
# Env:
#   VARIANT                   cpu (default: docker/Dockerfile) or gpu (docker/Dockerfile.gpu)
#   HVDKIT_IMAGE              image name (default: localhost/hvdkit:cpu, localhost/hvdkit:gpu)
#   HVDKIT_DOCKER_CACHE       base tar cache (default: ${XDG_CACHE_HOME:-~/.cache}/hvdkit/docker)
#   HVDKIT_WHEELS             wheel folders for pip in the build, colon-separated (default: /opt/wheels, which
#                             holds the CPU torch wheel); empty: none
#   HVDKIT_CUDA_ARCHS         gpu: the CUDA_ARCHS build argument (default: the Dockerfile's, 80,90,100)
#   HVDKIT_TORCH_INDEX_URL    torch index for the build (default: empty, the wheel folder is used)
#   HVDKIT_CA_BUNDLE          CA bundle for pip in the build (default: /etc/ssl/certs/ca-certificates.crt)
#   HVDKIT_BUILDAH_ISOLATION  chroot (default) or oci (runc, with cgroupfs and the host network)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS
VARIANT=${VARIANT:-cpu}
case $VARIANT in
  cpu) dockerfile=$root/docker/Dockerfile ;;
  gpu) dockerfile=$root/docker/Dockerfile.gpu ;;
  *) printf '[docker-test] ERROR: VARIANT=%s: use cpu or gpu\n' "$VARIANT" >&2; exit 1 ;;
esac
IMAGE=${HVDKIT_IMAGE:-localhost/hvdkit:cpu}
[[ $VARIANT == cpu ]] || IMAGE=${HVDKIT_IMAGE:-localhost/hvdkit:$VARIANT}
CACHE=${HVDKIT_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit/docker}
WHEELS=${HVDKIT_WHEELS-/opt/wheels}
TORCH_INDEX_URL=${HVDKIT_TORCH_INDEX_URL:-}
CA_BUNDLE=${HVDKIT_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
ISOLATION=${HVDKIT_BUILDAH_ISOLATION:-chroot}

say() { printf '[docker-test %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }
die() { printf '[docker-test] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root: mmdebstrap --mode=root and buildah without user namespaces need it"
# Flags for buildah itself, and for its bud and run commands.
case $ISOLATION in
  chroot) global=() isolation=(--isolation chroot) ;;
  # crun does not work here (hybrid cgroups); runc does with these flags.
  oci) global=(--cgroup-manager cgroupfs) isolation=(--isolation oci --network host) ;;
  *) die "HVDKIT_BUILDAH_ISOLATION=$ISOLATION: use chroot or oci" ;;
esac
bld() { buildah "${global[@]}" "$@"; }  # buildah with the global flags

# 0. Tools from the Debian archive.
tools=(buildah mmdebstrap)
[[ $ISOLATION == oci ]] && tools+=(runc)
missing=()
for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  say "installing ${missing[*]} from the Debian archive"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v python3 >/dev/null || die "python3 is needed to read the image's JSON config and the result line"

# 1. The base image: Debian bookworm minbase from the archive, made once and cached.
mkdir -p "$CACHE"
base_tar=$CACHE/bookworm-minbase.tar
if [[ ! -s $base_tar ]]; then
  say "making the bookworm base with mmdebstrap (about a minute) -> $base_tar"
  mmdebstrap --quiet --mode=root --variant=minbase --format=tar bookworm "$base_tar.part"
  mv "$base_tar.part" "$base_tar"
fi
# The tag names the tar's content, so a new tar makes a new base and an old one is reused.
base_image=localhost/hvdkit-base:bookworm-$(sha256sum "$base_tar" | cut -c1-12)
if ! buildah inspect --type image "$base_image" >/dev/null 2>&1; then
  say "wrapping the base tar as $base_image"
  printf 'FROM scratch\nADD bookworm-minbase.tar /\nCMD ["/bin/bash"]\n' > "$CACHE/Containerfile.base"
  bld bud --quiet "${isolation[@]}" -f "$CACHE/Containerfile.base" -t "$base_image" "$CACHE" >/dev/null
fi

containers=()
scratch=$(mktemp -d)
cleanup() {
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

# 2. The image. --layers keeps each step, so a second run rebuilds only what changed.
# The wheels and the CA bundle reach the RUN steps through one read-only folder mounted on /mnt:
# buildah leaves an empty mount point behind in the image, and /mnt is already there.
build_args=(--build-arg "BASE_IMAGE=$base_image")
if [[ $VARIANT == gpu ]]; then
  [[ -z ${HVDKIT_CUDA_ARCHS:-} ]] || build_args+=(--build-arg "CUDA_ARCHS=$HVDKIT_CUDA_ARCHS")
else
  build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi
mkdir -p "$scratch/mnt"
if [[ -n $WHEELS ]]; then
  mkdir -p "$scratch/mnt/wheels"
  IFS=: read -r -a wheel_dirs <<<"$WHEELS"
  for dir in "${wheel_dirs[@]}"; do
    [[ -d $dir ]] || die "HVDKIT_WHEELS: $dir is not a folder (set HVDKIT_WHEELS empty to use the package index only)"
    cp -al "$dir/." "$scratch/mnt/wheels/" 2>/dev/null || cp -a "$dir/." "$scratch/mnt/wheels/"
  done
  build_args+=(--build-arg PIP_FIND_LINKS=/mnt/wheels)
fi
if [[ -n $CA_BUNDLE ]]; then
  [[ -f $CA_BUNDLE ]] || die "HVDKIT_CA_BUNDLE=$CA_BUNDLE does not exist (set it empty for no bundle)"
  cp "$CA_BUNDLE" "$scratch/mnt/ca-certificates.crt"
  build_args+=(--build-arg PIP_CERT=/mnt/ca-certificates.crt)
fi
# The engine's wheel cache is a cache mount of the Dockerfile (buildah keeps it in
# /var/tmp/buildah-cache/hvdkit-engine-wheels); the layers are in buildah's storage.
say "building $IMAGE from ${dockerfile#"$root"/} (first time: the engine compiles, 10+ minutes)"
build_start=$SECONDS
bld bud "${isolation[@]}" --layers --force-rm --format docker --volume "$scratch/mnt:/mnt:ro" "${build_args[@]}" \
  -f "$dockerfile" -t "$IMAGE" "$root"
say "image built in $((SECONDS - build_start)) s"

# 3. Run it. A fresh container for each check; all of them removed at the end.
# Sets $ctr to a new container of the image (not in a subshell: cleanup must see the list).
new_container() {
  ctr=$(buildah from --pull-never "$IMAGE")
  containers+=("$ctr")
}
# One field of the image's OCI config, as JSON (buildah 1.28's --format has no json function).
image_config() {
  buildah inspect --type image "$IMAGE" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["OCIv1"]["config"].get(sys.argv[1])))' "$1"
}
# The result line the digits example prints on rank 0; fails unless it shows a trained 2-rank run.
check_result() {
  python3 - "$1" <<'EOF'
import json, sys
lines = [l.split("] ", 1)[1] for l in open(sys.argv[1]) if l.startswith("[rank 0] {")]
if len(lines) != 1:
    sys.exit(f"expected one result line from rank 0, found {len(lines)}")
result = json.loads(lines[0])
if result["world_size"] != 2 or not result["val_accuracy"] or result["val_accuracy"] < 0.9:
    sys.exit(f"not a trained 2-rank run: {result}")
print(f"val_accuracy {result['val_accuracy']} on {result['world_size']} ranks after {result['epochs']} epochs")
EOF
}

# The runtime stage is the image: nothing that compiles, no C/C++ or MPI headers. (openmpi-bin
# brings the mpicc wrapper, which calls gcc with the MPI headers: neither is there.)
say "no compiler and no headers in the image"
new_container
leftovers=$(bld run "${isolation[@]}" "$ctr" -- bash -c \
  'for t in gcc g++ cc c++ cpp ld as make cmake; do command -v "$t"; done; ls /usr/include/stdio.h /usr/include/x86_64-linux-gnu/openmpi /usr/include/python3*/Python.h 2>/dev/null; true')
[[ -z $leftovers ]] || die "the image still has build tools or headers: $(tr '\n' ' ' <<<"$leftovers")"

user=$(image_config User)
[[ $user == '"1000:1000"' ]] || die "the image's default user is $user, expected 1000:1000 (hvdkit)"
mapfile -d '' -t cmd < <(python3 -c 'import json, sys; sys.stdout.write("\0".join(json.loads(sys.argv[1])))' "$(image_config Cmd)")
if [[ $VARIANT == gpu ]]; then
  # Its default command starts one rank per visible GPU, else one per core: 2 ranks here, whatever the cores.
  [[ ${cmd[*]} == "hvdkit run -- python examples/torch_digits.py" ]] || die "unexpected default command: ${cmd[*]}"
  cmd=(hvdkit run -np 2 -- python examples/torch_digits.py)
  say "the engine has NCCL (and MPI, Gloo) and loads without a GPU"
  new_container
  bld run "${isolation[@]}" --hostname localhost "$ctr" -- python -c 'import torch, horovod.torch as hvd
hvd.init()
print(f"torch {torch.__version__} CUDA {torch.version.cuda}; nccl {hvd.nccl_built()} mpi {hvd.mpi_built()} gloo {hvd.gloo_built()}")
assert hvd.nccl_built() and hvd.mpi_built() and hvd.gloo_built()' || die "the engine in the image lacks NCCL, MPI or Gloo"
fi
say "running the default command as the default user: ${cmd[*]}"
new_container
bld run "${isolation[@]}" "$ctr" -- id -un | grep -qx hvdkit || die "the default user is not hvdkit"
bld run "${isolation[@]}" "$ctr" -- "${cmd[@]}" 2>&1 | tee "$scratch/default.log"
check_result "$scratch/default.log" || die "the default command did not train 2 ranks (log above)"

say "a 2-rank run as root (hvdkit run adds --allow-run-as-root)"
new_container
bld run "${isolation[@]}" --user root "$ctr" -- \
  hvdkit run -np 2 -- python examples/torch_digits.py 2>&1 | tee "$scratch/root.log"
check_result "$scratch/root.log" || die "the run as root failed (log above)"

# buildah's /etc/hosts lacks the container's own hostname (Docker and Kubernetes write it), and
# Horovod's Gloo init dies of SIGSEGV when that name does not resolve: give it one that does.
say "hvdkit doctor: versions, engine parts, 2-rank allreduce over MPI and over Gloo"
new_container
# Its exit status is the log's verdict, checked below with the log shown. A PyTorch-only engine (the GPU
# image has no TensorFlow) is no problem to doctor where TensorFlow is not installed.
bld run "${isolation[@]}" --hostname localhost "$ctr" -- hvdkit doctor 2>&1 | tee "$scratch/doctor.log" || true
grep -q '^all checks passed' "$scratch/doctor.log" || die "hvdkit doctor found problems in the image (log above)"
grep -Eq '^ +horovod engine fixes +hvdkit-fixes-' "$scratch/doctor.log" \
  || die "hvdkit doctor does not name the engine's fix level: the engine in the image is not hvdkit's (log above)"

# An MPI Operator worker: the key Secret mounted at the MPIJob's sshAuthMountPath (root's files,
# mode 0644), the image's entrypoint (buildah run skips ENTRYPOINT: it is named here), sshd started
# as in launch/mpijob.yaml, and the launcher's login to it with the same keys, by a worker name of
# the operator's hostfile (only such names go to port 2222 without host key checks).
say "sshd as user hvdkit with operator-style keys, and an ssh login like mpirun's"
mkdir -p "$scratch/ssh"
new_container
bld run "${isolation[@]}" --user root --volume "$scratch/ssh:/keys" "$ctr" -- \
  ssh-keygen -q -t rsa -b 3072 -N '' -C hvdkit-test -f /keys/id_rsa
cp "$scratch/ssh/id_rsa.pub" "$scratch/ssh/authorized_keys"
chmod 0644 "$scratch/ssh"/*
port=$(sed -n 's/^Port //p' "$root/docker/sshd_config")
! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || die "port $port is busy on this machine (the containers share its network)"
secret=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["spec"]["sshAuthMountPath"])' \
  "$root/launch/mpijob.yaml" 2>/dev/null || echo /home/hvdkit/.mpi-operator/ssh)
login=$(bld run "${isolation[@]}" --volume "$scratch/ssh:$secret:ro" "$ctr" -- /usr/local/bin/hvdkit-entrypoint bash -c '
  /usr/sbin/sshd -De -f /home/hvdkit/.sshd_config 2>/tmp/sshd.log & sshd=$!
  worker=(-o BatchMode=yes -o HostName=127.0.0.1 hvdkit-digits-worker-0.hvdkit-digits-worker)
  for _ in $(seq 50); do ssh "${worker[@]}" true 2>/dev/null && break; sleep 0.2; done
  ssh "${worker[@]}" "id -un; command -v orted"; rc=$?
  kill $sshd; wait $sshd 2>/dev/null
  ((rc == 0)) || cat /tmp/sshd.log >&2
  exit $rc') || die "ssh login to the image's sshd failed: $login"
[[ $login == $'hvdkit\n/usr/bin/orted' ]] || die "ssh login gave '$login', expected user hvdkit and orted on PATH"
say "ssh login ok: user $(head -n 1 <<<"$login"), orted found"

size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -n 1)
say "ok: $IMAGE ($size) built and trained 2 ranks; total $((SECONDS - start)) s"
