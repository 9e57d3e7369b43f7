"""scripts/fuzz.py: a seeded 2,000 inputs of every available target find nothing, and the driver
reports what planted bugs do (an exception, a crash, a hang) while counting edgellm's errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import fuzz  # noqa: E402
import fuzz_targets  # noqa: E402

TARGETS = sorted(fuzz_targets.TARGETS)


@pytest.fixture(scope="module")
def real_models_cached(smollm2_path, gemma3_path):
    """The tokenizer and template targets include the real models' when they are in the cache."""


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_seeded_inputs_find_nothing(name, real_models_cached, tmp_path):
    r = fuzz.fuzz(name, 2000, seed=0, timeout=120, findings=tmp_path, quiet=True)
    assert r["inputs"] == 2000
    assert r["findings"] == [], r["findings"]
    assert sum(r["expected"].values()) < 2000  # most inputs get past the first check


def test_every_target_is_listed():
    assert TARGETS == ["gguf", "http", "reply", "state", "template", "tokenizer"]


PLANTED = '''
import os, time
import fuzz_targets
from edgellm.errors import GGUFError

def generate(rng, ctx):
    return bytes([rng.randrange(5)])

@fuzz_targets.target("planted", generate=generate)
def planted(data, ctx):
    """Bugs on purpose."""
    kind = data[0]
    if kind == 1:
        raise KeyError("planted")
    if kind == 2:
        os.abort()
    if kind == 3:
        while True:
            time.sleep(0.05)
    if kind == 4:
        raise GGUFError("expected")
'''


def test_driver_reports_exceptions_crashes_and_hangs(tmp_path, monkeypatch):
    extra = tmp_path / "planted.py"
    extra.write_text(PLANTED)
    monkeypatch.setenv("EDGELLM_FUZZ_EXTRA_TARGETS", str(extra))
    fuzz_targets._extra_loaded = False
    import random

    kinds = [random.Random(f"0/{i}").randrange(5) for i in range(25)]
    r = fuzz.fuzz("planted", 25, seed=0, timeout=2, findings=tmp_path / "found", quiet=True)
    assert r["inputs"] == 25
    got = {(f["index"], f["kind"].split(" ")[0]) for f in r["findings"]}
    want = {(i, {1: "KeyError", 2: "crash", 3: "hang"}[k]) for i, k in enumerate(kinds) if k in (1, 2, 3)}
    assert got == want
    assert r["expected"] == {"GGUFError": kinds.count(4)}
    # a new worker after each crash and hang, except one on the last input (nothing is left to run)
    assert r["workers"] == 1 + sum(k in (2, 3) for k in kinds[:-1])
