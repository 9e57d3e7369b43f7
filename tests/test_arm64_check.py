"""The Raspberry Pi check (scripts/arm64_check.sh) as a test: edgellm installed with
`pip install .` in an arm64 Debian userland and run under qemu as a Pi 4 (Cortex-A72) and a Pi 5
(Cortex-A76) gives the x86 run's tokens, on the kernel path each CPU should take.

Part of the suite (so `.ci/run` runs it). On the 2-core VM a first run (userland built, wheels
downloaded) took 401 s of CPU, a run with the userland cached (~/.cache/edgellm/arm64-rootfs) 355 s
(with the NEON kernels in five files: 326 s of CPU, 11 min wall at load 6-9), and 105 s of CPU once
the C build goes through the userland's ccache and no C file changed since the last run; the
README's "Raspberry Pi" section has the phases. Needs root on an x86-64 Linux
host (or password-less sudo); EDGELLM_ARM64_CHECK=0 skips it.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "arm64_check.sh"
TIMEOUT = 20 * 60  # a loaded machine took 12.5 min for a first run; a hang must not eat the suite's 30


def _as_root() -> list[str]:
    """The command prefix that runs the check as root: none when we are root, `sudo -n` when it
    needs no password; skips (saying why) otherwise."""
    if os.geteuid() == 0:
        return []
    try:
        ok = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("the arm64 check needs root (mmdebstrap, user namespace id maps): run as root "
                    "or with password-less sudo")
    return ["sudo", "-n"]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.skipif(os.environ.get("EDGELLM_ARM64_CHECK") == "0", reason="EDGELLM_ARM64_CHECK=0")
def test_arm64_userland_gives_the_x86_tokens():
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        pytest.skip("the arm64 check runs on an x86-64 Linux host")
    prefix = _as_root()
    # both CPUs, always; its own session, so a timeout takes down qemu and everything in the chroot
    env = {k: v for k, v in os.environ.items() if k != "EDGELLM_ARM64_CPUS"}
    cmd = [*prefix, "env", f"PYTHON={sys.executable}", "sh", str(SCRIPT)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _signal_group(p.pid, signal.SIGTERM)  # TERM first: sudo passes it on, KILL it cannot
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        pytest.fail(f"arm64 check still running after {TIMEOUT} s:\n{out[-4000:]}")
    print(out)
    assert p.returncode == 0, out[-4000:]
    assert re.search(r"^arm64 check: cortex-a72 \(neon\): same text, same \d+ tokens as x86", out, re.M), out
    assert re.search(r"^arm64 check: cortex-a76 \(neon\+dotprod\): same text, same \d+ tokens as x86", out, re.M), out
    assert re.search(r"^arm64 check: OK", out, re.M), out
