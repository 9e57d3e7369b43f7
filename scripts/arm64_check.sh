#!/bin/sh
# The Raspberry Pi check without a Pi: an arm64 Debian userland built from Debian's packages,
# edgellm installed in it with `pip install .` as the README's "Raspberry Pi" section says, and
# `edgellm generate` on SmolLM2 at temperature 0 under qemu-aarch64 as a Cortex-A72 (Pi 4, no
# dot product) and a Cortex-A76 (Pi 5, dot product). Passes when both print exactly what this
# host's edgellm prints for the same prompt, and each reports the kernel path its CPU should take
# ("neon" on the A72, "neon+dotprod" on the A76; an sdot on the A72 would die of SIGILL).
#
#   sudo scripts/arm64_check.sh            # as root; tests/test_arm64_check.py runs it in the suite
#
# The userland: Debian bookworm arm64 (as Raspberry Pi OS bookworm), the essential packages plus
# what the README asks a Pi user to install, unpacked by mmdebstrap's extract variant; then the
# two configuration steps the check needs (the system users, ld.so's cache). Maintainer scripts
# are not run: under emulation debootstrap's second stage took 23 minutes on the 2-core VM.
# Programs run through arm64_chroot.py (qemu-aarch64-static in a private binfmt_misc instance).
# The userland and its virtual environment (with the dependencies pip installed in it) are cached
# in $EDGELLM_ARM64_CACHE (default ~/.cache/edgellm/arm64-rootfs), keyed by a hash of the recipe
# below; every run installs the current sources afresh and builds their C kernels with the
# userland's gcc. The model comes from the host's edgellm cache (bind-mounted read-only), where
# the host run fetches it through edgellm's resolver.
#
# Two departures from the README's commands, both for time under emulation:
# - pip is told not to byte-compile what it installs (`pip install --no-compile .`; the same files
#   are installed, Python compiles what it imports on first use). Compiling numpy's, numba's and
#   llvmlite's thousands of modules costs ~50 s of CPU, an eighth of a first run, and proves
#   nothing about edgellm.
# - the build's C compiler is the userland's gcc through ccache (CC="ccache gcc"; its cache is kept
#   in the cached userland): a C file whose preprocessed text and command line were compiled by an
#   earlier run gets that run's object, the same bytes gcc gives, instead of ~200 s of CPU of gcc
#   under emulation; changed files are compiled. The count of each is printed.
#
# Environment: PYTHON (the host's python with edgellm installed; default python3),
# EDGELLM_DEBIAN_MIRROR (default http://deb.debian.org/debian), EDGELLM_ARM64_CACHE,
# EDGELLM_ARM64_CPUS (default "cortex-a72 cortex-a76").
set -eu
cd "$(dirname "$0")/.."
SRC=$(pwd)
PYTHON=${PYTHON:-python3}
MIRROR=${EDGELLM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${EDGELLM_ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm/arm64-rootfs}
CPUS=${EDGELLM_ARM64_CPUS:-cortex-a72 cortex-a76}
MODEL=smollm2-135m-instruct
PROMPT="The three primary colours of light are red, green and blue. Mixing all three gives"
NGEN=24

T0=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
say() { echo "arm64 check: $*"; }
fail() { echo "arm64 check: FAILED: $*" >&2; exit 1; }
cpu_time() {  # CPU=user+sys seconds of the programs run so far (`times` in this shell, not a subshell)
    times > "$WORK/times"
    CPU=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); s += a[1] * 60 + a[2] } printf "%.0f", s }' "$WORK/times")
}
start() { T=$(date +%s); cpu_time; C=$CPU; }  # a phase: wall clock and CPU time of what it ran
took() { cpu_time; TOOK="$(( $(date +%s) - T )) s, CPU $(( CPU - C )) s"; }

[ "$(uname -s)" = Linux ] || fail "needs Linux"
[ "$(uname -m)" = x86_64 ] || fail "runs on an x86-64 host (it compares against the host's run)"
[ "$(id -u)" -eq 0 ] || fail "needs root (mmdebstrap, and the user namespace of arm64_chroot.py)"

# host tools (Debian packages)
if ! command -v mmdebstrap >/dev/null 2>&1 || [ ! -x /usr/bin/qemu-aarch64-static ]; then
    PKGS="mmdebstrap qemu-user-static"
    apt-get install -y -q --no-install-recommends $PKGS >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $PKGS >/dev/null; }
fi

# ---- the x86 reference (also fetches the model into the host's cache through the resolver)
start
HOST_OUT=$("$PYTHON" -m edgellm generate "$MODEL" -p "$PROMPT" -n $NGEN --temp 0 -t 2 -v 2>"$WORK/host.err") ||
    { cat "$WORK/host.err" >&2; fail "the host run failed"; }
ntok() { tail -n 1 "$1" | sed -n 's/.*| answer: \([0-9]*\) tok,.*/\1/p'; }  # tokens generated, from -v's line
HOST_N=$(ntok "$WORK/host.err")
[ -n "$HOST_N" ] || { cat "$WORK/host.err" >&2; fail "no token count in the host run's -v line"; }
took; say "x86 run ($(tail -n 1 "$WORK/host.err" | sed 's/.*| //; s/\]$//')): $HOST_N tokens, $TOOK"
MODELS=$("$PYTHON" -c "from edgellm.registry import home; print(home() / 'models')")

# ---- rootfs recipe (its text is the cache key)
SUITE=bookworm
PI_PACKAGES="python3-venv,python3-dev,gcc,libc6-dev,ca-certificates"
CHECK_PACKAGES="ccache"  # (the check's, not the README's: see above)
build_rootfs() {  # $1: target directory
    mmdebstrap --quiet --mode=root --variant=extract --architectures=arm64 \
        --include='?essential' --include="$PI_PACKAGES,$CHECK_PACKAGES" "$SUITE" "$1" "$MIRROR"
    cp "$1/usr/share/base-passwd/passwd.master" "$1/etc/passwd"
    cp "$1/usr/share/base-passwd/group.master" "$1/etc/group"
    "$PYTHON" scripts/arm64_chroot.py "$1" -- /sbin/ldconfig
}
# ---- end of recipe

KEY=$(sed -n '/^# ---- rootfs recipe/,/^# ---- end of recipe/p' "$0" | sha256sum | cut -c1-16)
ROOTFS=$CACHE/$KEY
mkdir -p "$CACHE"
if [ -f "$ROOTFS/.complete" ]; then
    say "userland cached ($ROOTFS)"
else
    start
    for old in "$CACHE"/*; do [ -d "$old" ] && rm -rf "$old"; done  # other recipes' userlands
    build_rootfs "$ROOTFS.tmp"
    mv "$ROOTFS.tmp" "$ROOTFS"
    touch "$ROOTFS/.complete"
    took; say "userland built from Debian $SUITE arm64 packages: $TOOK"
fi

# per run: the network settings and CA bundle of this host, the current sources
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
rm -rf "$ROOTFS/root/edgellm"
mkdir -p "$ROOTFS/root/edgellm"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then  # the checkout's files, edited or new
    git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null
else
    tar --exclude=.git --exclude=build --exclude='*.so' --exclude='*.egg-info' -cf - .
fi | tar -xf - -C "$ROOTFS/root/edgellm"

CERT=/etc/ssl/certs/ca-certificates.crt
run_arm64() {  # $1: CPU; the rest: a shell command run as root in the userland's /root/edgellm
    cpu=$1; shift
    "$PYTHON" scripts/arm64_chroot.py "$ROOTFS" --bind "$MODELS:/root/.cache/edgellm/models:ro" -- \
        /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 QEMU_CPU="$cpu" \
        PIP_CERT=$CERT SSL_CERT_FILE=$CERT REQUESTS_CA_BUNDLE=$CERT PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_RETRIES=10 \
        ${PIP_INDEX_URL:+PIP_INDEX_URL=$PIP_INDEX_URL} \
        /bin/sh -c "cd /root/edgellm && $*"
}

# ---- the README's install, as a Pi 4 (the virtual environment persists in the cached userland)
if ! [ -f "$ROOTFS/root/edgellm-venv/.complete" ]; then
    start
    rm -rf "$ROOTFS/root/edgellm-venv"
    run_arm64 cortex-a72 'python3 -m venv ~/edgellm-venv' || fail "python3 -m venv failed in the arm64 userland"
    touch "$ROOTFS/root/edgellm-venv/.complete"
    took; say "python3 -m venv ~/edgellm-venv: $TOOK"
fi
rm -rf "$ROOTFS"/root/edgellm-venv/lib/python3*/site-packages/edgellm \
       "$ROOTFS"/root/edgellm-venv/lib/python3*/site-packages/edgellm-*.dist-info  # a previous run's build
start
run_arm64 cortex-a72 '. ~/edgellm-venv/bin/activate; export CCACHE_DIR=~/.ccache; ccache -z >/dev/null;
    CC="ccache gcc" pip install -q --no-compile . && ccache --print-stats > ~/ccache-stats' ||
    fail "pip install . failed in the arm64 userland"
ccstat() { sed -n "s/^$1\t//p" "$ROOTFS/root/ccache-stats"; }
CCACHE="$(ccstat direct_cache_hit) + $(ccstat preprocessed_cache_hit) C files from ccache, $(ccstat cache_miss) compiled"
took; say "pip install --no-compile . (dependencies as aarch64 wheels from PyPI, the C kernels built by the userland's gcc under qemu; $CCACHE): $TOOK"

# ---- generate on each CPU
for cpu in $CPUS; do
    case $cpu in
        cortex-a72) want=neon ;;
        *) want=neon+dotprod ;;
    esac
    start
    out=$(run_arm64 "$cpu" ". ~/edgellm-venv/bin/activate; edgellm generate $MODEL -p '$PROMPT' -n $NGEN --temp 0 -t 2 -v" \
          2>"$WORK/$cpu.err") || { cat "$WORK/$cpu.err" >&2; fail "edgellm generate failed on $cpu"; }
    isa=$(tail -n 1 "$WORK/$cpu.err" | sed -n 's/.*| \([a-z0-9+]*\), [0-9]* threads\]$/\1/p')
    [ "$isa" = "$want" ] || fail "$cpu ran the '$isa' kernels, expected '$want'"
    n=$(ntok "$WORK/$cpu.err")
    [ "$out" = "$HOST_OUT" ] && [ "$n" = "$HOST_N" ] ||
        { printf 'x86 (%s tokens):   %s\n%s (%s tokens):   %s\n' "$HOST_N" "$HOST_OUT" "$cpu" "$n" "$out" >&2
          fail "$cpu's tokens differ from the x86 run's"; }
    took; say "$cpu ($isa): same text, same $n tokens as x86: $TOOK"
done
T=$T0 C=0
took; say "OK ($TOOK): $(printf '%s' "$HOST_OUT" | tr '\n' ' ')"
