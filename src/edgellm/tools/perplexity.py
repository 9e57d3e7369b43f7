"""`edgellm perplexity`: llama-perplexity's method, and its KL-divergence mode.

The method (tools/perplexity/perplexity.cpp, perplexity() and kl_divergence()):
- the whole text is tokenized once (BOS first where the model adds one; a single trailing newline
  of the file is dropped, as llama.cpp's -f does);
- it is cut into n_chunk = n_tokens // n_ctx chunks of n_ctx tokens (at least 2 * n_ctx tokens are
  needed); each chunk is evaluated on an empty cache with its first token replaced by BOS where
  the model uses one;
- only the second half is scored: the logits at positions first = n_ctx // 2 .. n_ctx - 2 predict
  the tokens after them, n_ctx - 1 - first tokens per chunk;
- PPL = exp(mean NLL); its error is PPL * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).
The logits file is llama.cpp's (--kl-divergence-base): "_logits_", u32 n_ctx, i32 n_vocab,
i32 n_chunk, the n_chunk * n_ctx tokens as i32, then for every scored position a row of
nv = 2 * ceil(n_vocab / 2) + 4 uint16: two float32 (scale, min log-prob) and the log-probs
quantized to 16 bits over [max - 16, max] of the logits.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Protocol, Sequence

import numpy as np

from ..errors import EdgeLLMError

MAGIC = b"_logits_"
_LOG_PROB_RANGE = 16.0  # log-probs below max - 16 are stored as the floor (llama.cpp's log_softmax)


class Scorer(Protocol):
    """What the tool needs from a model (edgellm.api.LLM provides it)."""

    n_vocab: int

    def logits(self, ids: Sequence[int], *, start: int = 0) -> np.ndarray: ...


def read_text(path: str | Path) -> str:
    """The file as llama.cpp's -f reads it: raw bytes as UTF-8, one trailing newline dropped."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EdgeLLMError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return text[:-1] if text.endswith("\n") else text


def n_chunks_for(n_tokens: int, n_ctx: int, limit: int | None = None) -> int:
    if n_ctx < 4:
        raise EdgeLLMError(f"the context must hold at least 4 tokens to score half of it (got {n_ctx})")
    if n_tokens < 2 * n_ctx:
        raise EdgeLLMError(f"the text has {n_tokens} tokens; perplexity with a context of {n_ctx} "
                           f"needs at least {2 * n_ctx}")
    n = n_tokens // n_ctx
    return n if limit is None or limit < 0 else min(n, limit)


def chunk_ids(tokens: Sequence[int], i: int, n_ctx: int, bos: int | None) -> list[int]:
    ids = list(tokens[i * n_ctx : (i + 1) * n_ctx])
    if bos is not None:
        ids[0] = bos
    return ids


def scored_logits(model: Scorer, ids: list[int]) -> np.ndarray:
    """Logits of the scored positions n_ctx // 2 .. n_ctx - 2: float32 [n_ctx - 1 - first, n_vocab]."""
    first = len(ids) // 2
    return model.logits(ids, start=first)[:-1]


def _log_softmax_parts(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: max logit and log(sum(exp(logit - max))) (the sum in float64, as llama.cpp)."""
    mx = logits.max(axis=1)
    sum_exp = np.exp(logits - mx[:, None]).sum(axis=1, dtype=np.float64)
    return mx.astype(np.float64), np.log(sum_exp)


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) for each row: float64 [rows]."""
    mx, lse = _log_softmax_parts(logits)
    return mx + lse - logits[np.arange(len(targets)), targets].astype(np.float64)


@dataclass
class Running:
    """Sum and sum of squares of per-token values, and the mean with its standard error."""
    total: float = 0.0
    total2: float = 0.0
    count: int = 0

    def add(self, v: np.ndarray) -> None:
        self.total += float(v.sum())
        self.total2 += float((v * v).sum())
        self.count += v.size

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def stderr(self) -> float:
        """sqrt(var / (count - 1)), 0 when undefined (as llama.cpp's mean_and_uncertainty)."""
        if self.count < 2:
            return 0.0
        var = self.total2 / self.count - self.mean**2
        return math.sqrt(var / (self.count - 1)) if var > 0 else 0.0


@dataclass
class PerplexityResult:
    n_ctx: int
    n_chunks: int
    nll: Running = field(default_factory=Running)
    chunk_ppl: list[float] = field(default_factory=list)  # running PPL after each chunk

    @property
    def ppl(self) -> float:
        return math.exp(self.nll.mean)

    @property
    def ppl_stderr(self) -> float:
        return self.ppl * self.nll.stderr


# --- the logits file ----------------------------------------------------------------------------

def _row_width(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


def pack_log_probs(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's 16-bit log-prob rows: uint16 [rows, nv] (first 8 bytes: float32 scale, min)."""
    rows, n_vocab = logits.shape
    mx = logits.max(axis=1)
    mn = np.maximum(logits.min(axis=1), mx - np.float32(_LOG_PROB_RANGE))
    _, lse = _log_softmax_parts(logits)
    out = np.zeros((rows, _row_width(n_vocab)), np.uint16)
    head = out[:, :4].view(np.float32)  # [rows, 2]
    scale = (mx - mn) / np.float32(65535)
    head[:, 0] = scale
    head[:, 1] = (mn - mx).astype(np.float32) - lse.astype(np.float32)
    ok = scale > 0
    inv = np.zeros_like(scale)
    inv[ok] = np.float32(1) / scale[ok]
    q = np.rint(inv[:, None] * (logits - mn[:, None]))  # round half to even, as nearest_int
    q[logits <= mn[:, None]] = 0
    out[:, 4 : 4 + n_vocab] = np.clip(q, 0, 65535).astype(np.uint16)
    return out


def unpack_log_probs(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """float32 [rows, n_vocab] log-probs from packed rows."""
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    return head[:, :1] * rows[:, 4 : 4 + n_vocab].astype(np.float32) + head[:, 1:2]


class LogitsWriter:
    def __init__(self, f: BinaryIO, n_ctx: int, n_vocab: int, n_chunk: int, tokens: Sequence[int]):
        self.f = f
        f.write(MAGIC + struct.pack("<Iii", n_ctx, n_vocab, n_chunk))
        f.write(np.asarray(tokens[: n_chunk * n_ctx], dtype="<i4").tobytes())

    def add(self, logits: np.ndarray) -> None:
        self.f.write(pack_log_probs(logits).astype("<u2").tobytes())


@dataclass
class LogitsFile:
    """A saved logits file, read chunk by chunk."""
    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # int32 [n_chunk * n_ctx]
    data_offset: int

    @classmethod
    def open(cls, path: str | Path) -> LogitsFile:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                head = f.read(20)
                if len(head) < 20 or head[:8] != MAGIC:
                    raise EdgeLLMError(f"{path}: not a logits file (saved with --save-logits)")
                n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", head[8:])
                if n_ctx < 4 or n_vocab <= 0 or n_chunk <= 0:
                    raise EdgeLLMError(f"{path}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, chunks {n_chunk})")
                tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype="<i4")
        except OSError as e:
            raise EdgeLLMError(f"{path}: cannot read: {e.strerror or e}") from None
        lf = cls(path, n_ctx, n_vocab, n_chunk, tokens, 20 + 4 * n_ctx * n_chunk)
        want = lf.data_offset + n_chunk * lf.rows_per_chunk * _row_width(n_vocab) * 2
        if tokens.size != n_ctx * n_chunk or path.stat().st_size != want:
            raise EdgeLLMError(f"{path}: truncated or inconsistent ({path.stat().st_size} bytes, "
                               f"expected {want} for {n_chunk} chunks of {n_ctx} tokens, {n_vocab} vocab)")
        return lf

    @property
    def rows_per_chunk(self) -> int:
        return self.n_ctx - 1 - self.n_ctx // 2

    def log_probs(self, i: int) -> np.ndarray:
        """float32 [rows_per_chunk, n_vocab] base-model log-probs of chunk i."""
        nv = _row_width(self.n_vocab)
        n = self.rows_per_chunk * nv
        rows = np.fromfile(self.path, dtype="<u2", count=n, offset=self.data_offset + 2 * i * n)
        return unpack_log_probs(rows.reshape(self.rows_per_chunk, nv), self.n_vocab)


# --- runs ---------------------------------------------------------------------------------------

def perplexity(model: Scorer, tokens: Sequence[int], n_ctx: int, *, bos: int | None,
               n_chunks: int | None = None, save: LogitsWriter | None = None,
               on_chunk: Callable[[int, PerplexityResult], None] | None = None) -> PerplexityResult:
    """Score `tokens` (already holding BOS where the model adds one); `bos` replaces each chunk's
    first token (None: the model uses no BOS)."""
    n = n_chunks_for(len(tokens), n_ctx, n_chunks)
    res = PerplexityResult(n_ctx, n)
    first = n_ctx // 2
    for i in range(n):
        logits = scored_logits(model, chunk_ids(tokens, i, n_ctx, bos))
        targets = np.asarray(tokens[i * n_ctx + first + 1 : (i + 1) * n_ctx], dtype=np.int64)
        res.nll.add(token_nll(logits, targets))
        res.chunk_ppl.append(res.ppl)
        if save is not None:
            save.add(logits)
        if on_chunk:
            on_chunk(i, res)
    return res


@dataclass
class KLResult:
    n_ctx: int
    n_chunks: int
    nll: Running = field(default_factory=Running)
    nll_base: Running = field(default_factory=Running)
    nll_cross: float = 0.0  # sum of nll * nll_base
    kld: Running = field(default_factory=Running)
    p_diff2: Running = field(default_factory=Running)  # (p - p_base)^2 and its square
    same_top: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.kld.count

    @property
    def ppl(self) -> float:
        return math.exp(self.nll.mean)

    @property
    def ppl_base(self) -> float:
        return math.exp(self.nll_base.mean)

    @property
    def log_ppl_ratio(self) -> tuple[float, float]:
        """ln(PPL(Q)/PPL(base)) and its error, with the covariance of the two (llama.cpp)."""
        cov = 0.0
        if self.count >= 10:
            cov = (self.nll_cross / self.count - self.nll.mean * self.nll_base.mean) / (self.count - 1)
        unc = self.nll.stderr**2 + self.nll_base.stderr**2 - 2 * cov
        return self.nll.mean - self.nll_base.mean, math.sqrt(max(unc, 0.0))

    @property
    def top1(self) -> tuple[float, float]:
        p = self.same_top / self.count
        return p, math.sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else 0.0

    @property
    def rms_p_diff(self) -> float:
        return math.sqrt(self.p_diff2.mean)

    def kld_quantile(self, q: float) -> float:
        return float(np.quantile(np.concatenate(self.kld_values), q))


_KL_ROWS = 32


def _kl_block(res: KLResult, logits: np.ndarray, base_lp: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Add a block of rows to res; returns their KL divergences."""
    rows = np.arange(len(targets))
    mx, lse = _log_softmax_parts(logits)
    log_p = logits.astype(np.float64) - (mx + lse)[:, None]  # the model's log-probs
    nll = -log_p[rows, targets]
    lb = base_lp.astype(np.float64)
    nll_base = -lb[rows, targets]
    # KL(base || model) over the tokens the base gives more than e^-16 (as llama.cpp)
    kld = np.where(lb > -_LOG_PROB_RANGE, np.exp(lb) * (lb - log_p), 0.0).sum(axis=1)
    p_diff = np.exp(-nll) - np.exp(-nll_base)
    res.nll.add(nll)
    res.nll_base.add(nll_base)
    res.nll_cross += float((nll * nll_base).sum())
    res.kld.add(kld)
    res.p_diff2.add(p_diff * p_diff)
    res.same_top += int((logits.argmax(axis=1) == base_lp.argmax(axis=1)).sum())
    return kld


def kl_divergence(model: Scorer, base: LogitsFile, *, bos: int | None, n_chunks: int | None = None,
                  on_chunk: Callable[[int, KLResult], None] | None = None) -> KLResult:
    """Compare the model's predictions with a saved base model's, on the base run's tokens."""
    if base.n_vocab != model.n_vocab:
        raise EdgeLLMError(f"{base.path}: saved with a vocabulary of {base.n_vocab} tokens, "
                           f"this model has {model.n_vocab}")
    tokens = base.tokens
    if tokens.size and (tokens.min() < 0 or tokens.max() >= model.n_vocab):
        raise EdgeLLMError(f"{base.path}: holds token ids outside this model's vocabulary")
    n_ctx, first = base.n_ctx, base.n_ctx // 2
    n = base.n_chunk if n_chunks is None or n_chunks < 0 else min(base.n_chunk, n_chunks)
    res = KLResult(n_ctx, n)
    for i in range(n):
        logits = scored_logits(model, chunk_ids(tokens.tolist(), i, n_ctx, bos))
        base_lp = base.log_probs(i)
        targets = tokens[i * n_ctx + first + 1 : (i + 1) * n_ctx].astype(np.int64)
        kld = np.empty(len(targets))
        for r in range(0, len(targets), _KL_ROWS):  # row blocks keep the float64 temporaries small
            kld[r : r + _KL_ROWS] = _kl_block(res, logits[r : r + _KL_ROWS], base_lp[r : r + _KL_ROWS],
                                             targets[r : r + _KL_ROWS])
        res.kld_values.append(kld)
        if on_chunk:
            on_chunk(i, res)
    return res
