#!/bin/sh
# Install what the tests need and run the whole suite (the README's second command; CI runs it).
set -eu
cd "$(dirname "$0")/.."

# Debian packages for the NEON kernel tests (an aarch64 cross compiler and qemu-user), the emulated
# x86 kernel test (SIMDe, header-only), the clang builds and the arm64 userland check
# (tests/test_arm64_check.py: mmdebstrap, qemu-user-static; the script would install them itself).
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1 ||
        [ ! -e /usr/include/simde/x86/avx512.h ] || ! command -v clang >/dev/null 2>&1 ||
        ! command -v mmdebstrap >/dev/null 2>&1 || [ ! -x /usr/bin/qemu-aarch64-static ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    PKGS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libsimde-dev clang mmdebstrap qemu-user-static"
    $SUDO apt-get install -y -q $PKGS >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q $PKGS; }
fi

python3 -m pip install -q ".[test]"
# run from tests/ so the installed package (with its compiled kernels) is what gets imported
exec python3 -m pytest -q -p no:cacheprovider --durations=15 --rootdir=. tests "$@"
