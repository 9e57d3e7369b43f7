"""One sequence on an engine, with the operations engine tests need (decode, clear, truncate,
shift): an `edgellm.LLM` session underneath, so the tests exercise the public path."""

from __future__ import annotations

import edgellm
from edgellm.batch import LOGITS_ALL, LOGITS_LAST

from conftest import use_engine_path


class SeqEngine:
    def __init__(self, path, *, n_ctx: int = 128, n_batch: int = 16, n_threads: int = 2):
        self.llm = edgellm.LLM(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self.session = self.llm.session()
        self.n_vocab = self.llm.n_vocab
        self.isa = self.llm.backend

    @property
    def n_past(self) -> int:
        return len(self.session)

    def decode(self, ids, *, all_logits: bool = False):
        return self.session._feed(ids, logits=LOGITS_ALL if all_logits else LOGITS_LAST).copy()

    def clear(self) -> None:
        self.session.reset()

    def truncate(self, n: int) -> bool:
        with self.llm._engine_lock:
            return self.llm._pool.truncate(self.session._seq, n)

    def shift(self, n_keep: int, n_discard: int) -> None:
        with self.llm._engine_lock:
            self.llm._pool.shift(self.session._seq, n_keep, n_discard)


def engine(path, backend, monkeypatch, *, n_ctx=128, n_batch=16, n_threads=2) -> SeqEngine:
    """A fresh sequence on `backend` (conftest.engine_paths) over the model at path."""
    use_engine_path(monkeypatch, backend)
    return SeqEngine(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
