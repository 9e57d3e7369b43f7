"""The Raspberry Pi check (scripts/arm64_check.sh) as a test: edgellm installed with
`pip install .` in an arm64 Debian userland and run under qemu as a Pi 4 (Cortex-A72) and a Pi 5
(Cortex-A76) gives the x86 run's tokens, on the kernel path each CPU should take.

Opt-in (EDGELLM_ARM64_CHECK=1): everything in the userland runs under qemu, pip's build of the C
kernels and two generate runs take 381 s of CPU with the userland cached (2-core VM), and a first
run also builds the userland and downloads the wheels - more than the suite's budget allows. CI
runs scripts/arm64_check.sh itself after the suite (.ci/run). Needs root on an x86-64 Linux host.
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
TIMEOUT = 40 * 60


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.skipif(os.environ.get("EDGELLM_ARM64_CHECK") != "1",
                    reason="opt-in, EDGELLM_ARM64_CHECK=1: minutes under qemu (.ci/run runs scripts/arm64_check.sh)")
def test_arm64_userland_gives_the_x86_tokens():
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        pytest.skip("the arm64 check runs on an x86-64 Linux host")
    if os.geteuid() != 0:
        pytest.skip("the arm64 check needs root (mmdebstrap, user namespace id maps)")
    # its own session, so a timeout takes down qemu and everything in the chroot with it
    env = {k: v for k, v in os.environ.items() if k != "EDGELLM_ARM64_CPUS"}  # both CPUs, always
    p = subprocess.Popen(["sh", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, "PYTHON": sys.executable}, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"arm64 check still running after {TIMEOUT} s:\n{out[-4000:]}")
    print(out)
    assert p.returncode == 0, out[-4000:]
    assert re.search(r"^arm64 check: cortex-a72 \(neon\): same text, same \d+ tokens as x86", out, re.M), out
    assert re.search(r"^arm64 check: cortex-a76 \(neon\+dotprod\): same text, same \d+ tokens as x86", out, re.M), out
    assert re.search(r"^arm64 check: OK", out, re.M), out
