"""The Python API: `LLM` (load once; tokenize, logits, generate, chat) and `Session` (a KV cache
you feed token by token). The CLI is a thin shell over these.

    llm = edgellm.LLM("smollm2-135m-instruct")
    llm.generate("The capital of France is", max_tokens=16, temperature=0)
"""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from . import kernels, models
from .errors import ContextOverflowError, GGUFError, GrammarError
from .batch import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE, Step
from .gguf_file import GGUFFile
from .kv_cache import DEFAULT_CACHE_TYPE, KVPool, cache_type, head_sizes
from .models.base import bind_weights, is_recurrent
from .registry import resolve
from .sampling import Sampler, SamplingParams, StopChecker
from .tokenizer import Tokenizer
from .weights import WeightStore

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 256  # tokens per prefill step: as fast as 512 here, half the scratch memory
DEFAULT_MAX_TOKENS = 256
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "frequency_penalty", "presence_penalty")


def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads share one core's units)."""
    try:
        avail = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        avail = os.cpu_count() or 1
    cores = set()
    try:
        for cpu in (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(avail)):
            base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
            with open(base + "core_id") as f:
                core = f.read().strip()
            with open(base + "physical_package_id") as f:
                pkg = f.read().strip()
            cores.add((pkg, core))
    except OSError:
        return max(1, avail)
    return max(1, min(avail, len(cores) or avail))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def clamp_threads(n: int) -> int:
    """n threads, or the CPUs this process may use if fewer (with a warning): threads beyond
    them only wait for each other."""
    cpus = usable_cpus()
    if n > cpus and os.environ.get("EDGELLM_NO_CLAMP") != "1":  # (benchmarks of oversubscription)
        warnings.warn(f"{n} threads requested but this process may use {cpus} CPU"
                      f"{'s' if cpus > 1 else ''}: using {cpus}", stacklevel=3)
        return cpus
    return n


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    stop_reason: str = ""  # "eog", "stop", "length", "grammar" (the constraint admits nothing more), or
    # "interrupted" (Ctrl-C, or the stream closed): prompt_tokens then counts what was evaluated
    forced_tokens: int = 0  # of generated_tokens, appended because the constraint forced them
    # speculative decoding (generate(..., speculative=)): draft tokens verified, how many of them
    # were taken, in how many steps
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafts taken per verification step."""
        return self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0


class Session:
    """A sequence of the model's KV cache: `feed(ids)` continues where the last call stopped.

    Sessions of one LLM share its engine (weights, threads, KV pool) and may be used from
    different threads; each call on one session must finish before the next starts. Their numbers
    are llama.cpp's: a step takes the kernels llama.cpp takes for a batch of its size."""

    def __init__(self, llm: "LLM", _seq=None):
        self._llm = llm
        self._seq = llm._pool.new_sequence() if _seq is None else _seq
        self._busy = threading.Lock()
        # the blocks go back to the pool when the session is dropped
        self._finalizer = weakref.finalize(self, _release_sequence, llm._engine_lock, llm._pool, self._seq)
        self._out = np.empty((1, llm.n_vocab), dtype=np.float32)  # this session's last logits
        self._llama_order = True  # llama.cpp's numbers; speculative decoding runs batch-invariant

    def __len__(self) -> int:
        return self._seq.n

    @property
    def tokens(self) -> list[int]:
        return list(self._seq.tokens)

    @property
    def n_ctx(self) -> int:
        return self._llm.n_ctx

    def reset(self) -> None:
        with self._llm._engine_lock:
            self._llm._pool.clear(self._seq)

    def close(self) -> None:
        """Give the session's KV blocks back now (it is empty afterwards)."""
        self.reset()

    def fork(self) -> "Session":
        """A new session holding the same tokens: it shares this one's KV blocks until either
        writes into a shared one (copy-on-write), so forking a long context is free."""
        with self._llm._engine_lock:
            return Session(self._llm, self._llm._pool.fork(self._seq))

    def save_state(self, path: str | os.PathLike, meta=None) -> None:
        """Write what the session holds (its tokens and KV cache, with the model's sha256 and the
        cache types) to path; meta: JSON-able data kept with it (load_state returns it)."""
        from . import state

        with self._llm._engine_lock:
            state.save(self._llm, self._seq, path, meta)

    def load_state(self, path: str | os.PathLike):
        """Replace what the session holds by a saved state: feeding goes on as if it had never
        stopped. Raises state.StateFileError (the session unchanged) for a truncated or corrupt
        file, another model, other cache types or a context too small. Returns its meta."""
        from . import state

        with self._llm._engine_lock:
            return state.load(self._llm, self._seq, path)

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Evaluate ids after what the session holds; returns the logits of the last one."""
        return np.array(self._feed(ids))

    def _feed(self, ids: Sequence[int], *, logits: int = LOGITS_LAST):
        """As feed, but the logits are this session's buffer, overwritten by its next call.
        Steps of n_batch tokens, so an interrupt stops a long prompt within one step."""
        ids = self._llm._check_ids(ids)
        if not ids:
            raise ValueError("feed() needs at least one token")
        if self._seq.n + len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{self._seq.n + len(ids)} tokens do not fit in the context of {self.n_ctx} tokens")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this session is in use by another thread (a session runs one call at a time; "
                               "use one session per thread)")
        try:
            return self._feed_steps(ids, logits)
        finally:
            self._busy.release()

    def _feed_steps(self, ids: list[int], logits: int):
        llm = self._llm
        nb = llm.n_batch
        rows = []
        for i in range(0, len(ids), nb):
            chunk = ids[i:i + nb]
            last = i + nb >= len(ids)
            mode = logits if logits == LOGITS_ALL else (logits if last else LOGITS_NONE)
            if mode == LOGITS_ALL and len(chunk) > self._out.shape[0]:
                self._out = np.empty((len(chunk), llm.n_vocab), dtype=np.float32)
            step = Step()
            step.add(self._seq, chunk, mode)
            with llm._engine_lock:
                llm._pool.reserve(self._seq, len(chunk))
                got = step.run(llm._engine, llm._pool, llama_order=self._llama_order, out=self._out)[0]
            if mode == LOGITS_ALL:
                rows.append(np.array(got))
            elif mode == LOGITS_LAST:
                rows.append(got)
        if logits == LOGITS_ALL:
            return np.concatenate(rows, axis=0)
        return rows[-1] if rows else None

    # -- used by generation --

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Make the cache hold exactly ids, reusing the longest common prefix; logits of the last."""
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"the prompt has {len(ids)} tokens; the context holds {self.n_ctx}")
        n = 0
        for a, b in zip(self._seq.tokens, ids):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)  # re-evaluate at least the last token to get its logits
        if n < self._seq.n:
            with self._llm._engine_lock:
                if not self._llm._pool.truncate(self._seq, n):
                    self._llm._pool.clear(self._seq)
                    n = 0
        return self._feed(ids[n:])

    def _set_llama_order(self, on: bool) -> None:
        """Which arithmetic the next steps use; what the cache holds was computed with the other
        one, so it is forgotten when that changes."""
        if on != self._llama_order:
            self.reset()
            self._llama_order = on

    def _make_room(self, n_keep: int) -> None:
        """Context full: drop the older half of what follows the first n_keep tokens."""
        n_keep = max(0, min(n_keep, self._seq.n - 2))
        n_discard = max(1, (self._seq.n - n_keep) // 2)
        with self._llm._engine_lock:
            if self._llm._pool.shift(self._seq, n_keep, n_discard):
                return
            tokens = list(self._seq.tokens)  # (clear empties the list; a sliding window: never with a
            # small n_keep, the window is then all moved slots; a recurrent model: always)
            self._llm._pool.clear(self._seq)
        self._feed(tokens)


def _release_sequence(lock, pool, seq) -> None:
    with lock:
        pool.release(seq)


class LLM:
    """A loaded model. `model` is an alias from models.toml or a path to a .gguf file."""

    def __init__(self, model: str | os.PathLike, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None,
                 seed: int | None = None, n_batch: int = DEFAULT_N_BATCH, chat_template: str | None = None,
                 progress: bool = False, cache_type_k: str = DEFAULT_CACHE_TYPE,
                 cache_type_v: str = DEFAULT_CACHE_TYPE, mlock: bool = False):
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch <= 0:
            raise ValueError(f"n_batch must be positive, got {n_batch}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive, got {n_threads}")
        self.path = resolve(model, progress=progress)
        self.gguf = GGUFFile(self.path)
        self.config = models.load_config(self.gguf)
        self._weights = bind_weights(self.gguf, self.config)
        # mapped now; into huge pages when the first context is made; mlock: held in RAM (weights.py)
        self._store = WeightStore(self.gguf, mlock=mlock)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        if self.tokenizer.n_vocab != self.config.n_vocab:
            raise GGUFError(f"the tokenizer has {self.tokenizer.n_vocab} tokens but the model "
                            f"{self.config.n_vocab} output rows")
        self.gguf.drop_metadata_pages()  # parsed: resident only as far as they are read again
        # the KV cache types (kv_cache.CACHE_TYPES: f16, q8_0, q4_0), checked before any work
        self.cache_type_k, self.cache_type_v = str(cache_type_k).lower(), str(cache_type_v).lower()
        hk, hv = head_sizes(self.config)
        self._cache_types = (cache_type(cache_type_k, hk, "cache_type_k"), cache_type(cache_type_v, hv, "cache_type_v"))
        self.n_ctx = n_ctx or self.config.n_ctx_train
        self.n_batch = min(n_batch, self.n_ctx)
        self.n_threads = clamp_threads(n_threads or physical_cores())
        self.seed = seed
        self._chat_template_override = chat_template
        self._template = None  # built on first use: jinja2 is not needed to generate (startup time)
        if chat_template is not None:
            self.template  # noqa: B018 - a template given explicitly is checked now
        self._engine_lock = threading.RLock()  # one engine step at a time; the pool's books with it
        self._eng = None   # the engine and its KV pool, made on first use
        self._kv = None
        self._session: Session | None = None  # generate/chat reuse its cache across calls
        self._session_owner = threading.Lock()  # held while a call uses the cached session
        self._stats = threading.local()

    # -- basics --

    @property
    def template(self):
        """The chat template (the model's, the override given, or a built-in fallback)."""
        if self._template is None:
            from .chat import ChatTemplate

            meta = self.gguf.metadata
            if self._chat_template_override is not None:
                meta = {**meta, "tokenizer.chat_template": self._chat_template_override}
            self._template = ChatTemplate.from_metadata(meta, add_bos=self.tokenizer.add_bos,
                                                        add_eos=self.tokenizer.add_eos)
        return self._template

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    @property
    def backend(self) -> str:
        """The kernel path generation runs on: generic / avx2 / avx512 / neon, or numba."""
        return self._engine.isa

    @property
    def _engine(self):
        """The model's one engine (weights, thread pool, KV storage), made on first use."""
        if self._eng is None:
            with self._engine_lock:
                if self._eng is None:
                    if kernels.backend_name() == "c":
                        self._store.move_to_huge_pages()
                    eng = kernels.create_engine(self.gguf, self.config, self._weights, n_ctx=self.n_ctx,
                                                n_batch=self.n_batch, n_threads=self.n_threads, store=self._store,
                                                cache_types=self._cache_types)
                    self._kv = KVPool(eng, n_ctx=self.n_ctx, n_swa=self.config.n_swa, has_swa=eng.has_swa,
                                      recurrent=is_recurrent(self.config))
                    self._eng = eng
        return self._eng

    @property
    def _pool(self) -> KVPool:
        """The block manager of the engine's KV storage."""
        self._engine  # noqa: B018 - made together
        return self._kv

    @property
    def last_stats(self) -> GenerationStats:
        """Token counts and speeds of this thread's last generate() / chat() call."""
        st = getattr(self._stats, "value", None)
        return st if st is not None else GenerationStats()

    @last_stats.setter
    def last_stats(self, value: GenerationStats) -> None:
        self._stats.value = value

    def _check_ids(self, ids) -> list[int]:
        out = [int(i) for i in ids]
        for i in out:
            if not 0 <= i < self.n_vocab:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.n_vocab})")
        return out

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        return self.tokenizer.decode(self._check_ids(ids), special=special)

    def session(self) -> Session:
        return Session(self)

    @property
    def model_sha256(self) -> str:
        """The model file's sha256 (computed once; saved states record it)."""
        if getattr(self, "_sha256", None) is None:
            from .state import file_sha256

            self._sha256 = file_sha256(self.path)
        return self._sha256

    def save_state(self, path: str | os.PathLike, meta=None) -> None:
        """Save the prompt cache generate() and chat() reuse (llama-cpp-python's save_state):
        a later process's load_state continues from it without evaluating it again."""
        with self._session_owner:
            if self._session is None:
                self._session = Session(self)
            self._session.save_state(path, meta)

    def load_state(self, path: str | os.PathLike):
        """Make a saved state the prompt cache of the next generate() / chat(); returns its meta."""
        with self._session_owner:
            if self._session is None:
                self._session = Session(self)
            return self._session.load_state(path)

    def reset(self) -> None:
        """Forget the prompt cache that generate() and chat() reuse across calls: the next call
        evaluates its whole prompt in one batch (as a fresh llama.cpp context does)."""
        if self._session is not None:
            with self._session_owner:
                self._session.reset()

    def logits(self, ids: Sequence[int], *, last_only: bool = False, start: int = 0) -> np.ndarray:
        """float32 [len(ids) - start, n_vocab] (or [n_vocab] with last_only) from one evaluation of
        ids on a fresh context; rows before `start` are evaluated but their logits not computed."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("logits() needs at least one token")
        if not 0 <= start < len(ids):
            raise ValueError(f"start must be in [0, {len(ids)})")
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit in the context of {self.n_ctx} tokens")
        s = Session(self)
        try:
            if last_only:
                return np.array(s._feed(ids))
            if start:
                s._feed(ids[:start], logits=LOGITS_NONE)
            return s._feed(ids[start:], logits=LOGITS_ALL)
        finally:
            s.close()

    # -- generation --

    def _sampling(self, kw: dict, seed) -> SamplingParams:
        unknown = set(kw) - set(_SAMPLING_KEYS)
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        params = {k: v for k, v in kw.items() if v is not None}
        return SamplingParams(seed=self.seed if seed is None else seed, **params)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = DEFAULT_MAX_TOKENS,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 min_p: float | None = None, repeat_penalty: float | None = None,
                 frequency_penalty: float | None = None, presence_penalty: float | None = None,
                 seed: int | None = None, stop: str | Sequence[str] | None = None, stream: bool = False,
                 repeat_last_n: int | None = None, json_schema: dict | str | None = None,
                 grammar=None, regex: str | None = None, speculative=None):
        """Complete `prompt` (text, or token ids used as given). A str, or an iterator of pieces.
        At most one constraint: `json_schema` (dict or JSON text), `grammar` (GBNF text or a
        constrain.Grammar), `regex`; last_stats.stop_reason "length" then means the output was
        cut before the constraint was complete. speculative: "lookup", a draft model (LLM, alias
        or path) or a speculative.Speculative: speculative decoding, on the batch-invariant path
        (see edgellm.speculative); with a constraint, drafts are cut to what it allows."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        params = self._sampling(dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                     repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                     presence_penalty=presence_penalty, repeat_last_n=repeat_last_n), seed)
        it = self._stream(ids, params, max_tokens, stop, self._constraint(
            json_schema=json_schema, grammar=grammar, regex=regex), self._speculative(speculative))
        return it if stream else "".join(it)

    def _constraint(self, **options):
        """The generation constraint for generate()'s / chat()'s constraint keywords, or None."""
        if all(v is None for v in options.values()):
            return None
        from .constrain import Grammar

        return Grammar.from_options(**options).constraint(self.tokenizer)

    def chat(self, messages: list[dict], *, stream: bool = False, max_tokens: int | None = None,
             stop: str | Sequence[str] | None = None, seed: int | None = None, response_format: dict | None = None,
             json_schema: dict | str | None = None, grammar=None, regex: str | None = None,
             tools: list[dict] | None = None, tool_choice=None, speculative=None, **sampling):
        """Reply to a conversation rendered with the model's chat template. The reply may be
        constrained by OpenAI's `response_format` or by one of generate()'s constraints.
        `tools` (OpenAI's function specs) reach the template; tool_choice "required" or
        {"type": "function", "function": {"name": ...}} makes the reply a call (chat_message
        parses it into tool_calls). speculative: as generate()'s."""
        it, _ = self._chat(messages, stream=stream, max_tokens=max_tokens, stop=stop, seed=seed,
                           response_format=response_format, json_schema=json_schema, grammar=grammar,
                           regex=regex, tools=tools, tool_choice=tool_choice, speculative=speculative, **sampling)
        return it if stream else "".join(it)

    def chat_message(self, messages: list[dict], **options) -> dict:
        """chat(), read back as an OpenAI assistant message: {"role": "assistant", "content",
        "tool_calls" (if the model called tools), "reasoning_content" (a <think> block)}."""
        return self.create_chat_completion(messages, **options)["choices"][0]["message"]

    def create_chat_completion(self, messages: list[dict], *, stream: bool = False, **options):
        """chat() as OpenAI's chat.completion object (message, finish_reason, usage); with
        stream=True an iterator of its chat.completion.chunk objects, as the server streams them:
        the role first, then content / reasoning_content text and tool_calls deltas (a call's id
        and name, then its arguments in fragments as they are written), then finish_reason. The
        chunks add up to the message the same call without stream returns."""
        from .tool_calls.turn import finish_reason

        it, turn = self._chat(messages, **options)
        cid, created = "chatcmpl-" + os.urandom(12).hex(), int(time.time())
        json_answer = options.get("response_format") is not None or options.get("json_schema") is not None
        if stream:
            return self._chunks(it, turn.reply(json_answer), cid, created, bool(options.get("tools")))
        msg, finish = turn.message("".join(it), self.last_stats.stop_reason, json_answer=json_answer)
        s = self.last_stats
        return {"id": cid, "object": "chat.completion", "created": created, "model": self.path.name,
                "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
                          "total_tokens": s.prompt_tokens + s.generated_tokens}}

    def _chunks(self, pieces, reply, cid: str, created: int, tools: bool) -> Iterator[dict]:
        from .tool_calls.turn import finish_reason

        def chunk(delta: dict, finish=None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.path.name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        # with tools the content may never come (a call instead): null until it does, as OpenAI sends it
        yield chunk({"role": "assistant", "content": None if tools else ""})
        for piece in pieces:
            yield from (chunk(d) for d in reply.feed(piece))
        yield from (chunk(d) for d in reply.close())
        yield chunk({}, finish_reason(reply, self.last_stats.stop_reason))

    def _chat(self, messages, *, stream: bool = False, max_tokens=None, stop=None, seed=None, response_format=None,
              json_schema=None, grammar=None, regex=None, tools=None, tool_choice=None, speculative=None, **sampling):
        from .tool_calls import in_answer, prepare_turn

        turn = prepare_turn(self.template, messages, tools, tool_choice)
        ids = self.chat_tokens(turn.prompt)
        params = self._sampling(sampling, seed)
        g = in_answer(turn.fmt, self._chat_grammar(response_format, json_schema, grammar, regex, turn.grammar))
        constraint = None if g is None else g.constraint(self.tokenizer)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return self._stream(ids, params, max_tokens, stops + list(self.template.stop_strings), constraint,
                            self._speculative(speculative), self.tokenizer.preserved_ids(turn.markers)), turn

    @staticmethod
    def _chat_grammar(response_format, json_schema, grammar, regex, tool_call_grammar=None):
        """The one Grammar a chat request's constraints give (OpenAI's response_format,
        generate()'s json_schema / grammar / regex, a required tool call's), or None."""
        from .constrain import Grammar

        if response_format is not None or tool_call_grammar is not None:
            given = [g for g in (Grammar.from_response_format(response_format), grammar,
                                 None if tool_call_grammar is None else Grammar.from_lark(tool_call_grammar))
                     if g is not None]
            if len(given) > 1 or (given and (json_schema is not None or regex is not None)):
                raise GrammarError("give one of response_format, json_schema, grammar, regex and a required "
                                   "tool call, not several")
            grammar = given[0] if given else None
        return Grammar.from_options(json_schema=json_schema, grammar=grammar, regex=regex)

    def _speculative(self, value):
        from .speculative import resolve

        return resolve(self, value)

    # -- many sequences at once --

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], *, max_tokens: int | None = DEFAULT_MAX_TOKENS,
                       seed: int | Sequence[int] | None = None, stop: str | Sequence[str] | None = None,
                       max_seqs: int | None = None, json_schema: dict | str | None = None, grammar=None,
                       regex: str | None = None, **sampling) -> list[str]:
        """Complete every prompt, decoding them together (BatchEngine); the texts in order.
        `seed`: one for every prompt, or a list (one each). A prompt's text is the same as it
        would be alone (batch invariance), though not llama.cpp's bits: see the README.
        json_schema / grammar / regex: one constraint every completion follows, as generate()."""
        from .constrain import Grammar

        sampling["grammar"] = Grammar.from_options(json_schema=json_schema, grammar=grammar, regex=regex)
        return self._batch([(p, None, frozenset()) for p in prompts], max_tokens, seed, stop, max_seqs, sampling)

    def chat_batch(self, conversations: Sequence[list[dict]], *, max_tokens: int | None = DEFAULT_MAX_TOKENS,
                   seed: int | Sequence[int] | None = None, stop: str | Sequence[str] | None = None,
                   max_seqs: int | None = None, response_format: dict | None = None,
                   json_schema: dict | str | None = None, grammar=None, regex: str | None = None,
                   tools: list[dict] | None = None, tool_choice=None, **sampling) -> list[str]:
        """Reply to every conversation (rendered with the chat template), decoded together.
        response_format / json_schema / grammar / regex: one constraint every reply follows, as
        chat(). tools / tool_choice: as chat()'s, the same for every conversation; a reply's calls
        are in its text as the model writes them (tool_calls.parse reads them)."""
        from .tool_calls import detect_format, in_answer, prepare_turn

        turns = [prepare_turn(self.template, m, tools, tool_choice) for m in conversations]
        call = turns[0].grammar if turns else None  # (one for all: the same tools and tool_choice)
        sampling["grammar"] = in_answer(detect_format(self.template.source),
                                        self._chat_grammar(response_format, json_schema, grammar, regex, call))
        items = [(self.chat_tokens(t.prompt), self.template.stop_strings, self.tokenizer.preserved_ids(t.markers))
                 for t in turns]
        return self._batch(items, max_tokens, seed, stop, max_seqs, sampling)

    def _batch(self, items, max_tokens, seed, stop, max_seqs, sampling) -> list[str]:
        """items: (prompt, its own stop strings or None, the control tokens its text keeps)."""
        from .scheduler import BatchEngine

        if not items:
            return []
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(items)
        if len(seeds) != len(items):
            raise ValueError(f"{len(seeds)} seeds for {len(items)} prompts")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        ids = [self.tokenize(p) if isinstance(p, str) else self._check_ids(p) for p, _, _ in items]
        per = [min(self.n_ctx, len(i) + (max_tokens if max_tokens is not None else self.n_ctx)) for i in ids]
        engine = BatchEngine(self, max_seqs=max_seqs or min(len(items), 32),
                             kv_tokens=min(sum(per), 8 * self.n_ctx) if sum(per) > self.n_ctx else self.n_ctx)
        grammar = sampling.pop("grammar", None)
        reqs = [engine.submit(i, max_tokens=max_tokens, sampling=self._sampling(sampling, sd),
                              stop=stops + list(extra or ()), grammar=grammar, preserved=preserved)
                for i, (_, extra, preserved), sd in zip(ids, items, seeds)]
        engine.run_until_done(reqs)
        return [r.result() for r in reqs]

    def chat_tokens(self, rendered: str) -> list[int]:
        """Tokens of a rendered chat prompt: special tokens parsed, BOS not doubled."""
        bos = self.tokenizer.bos_id
        ids = self.tokenize(rendered, add_bos=True, special=True)
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def _stream(self, ids: list[int], params: SamplingParams, max_tokens, stop, constraint=None,
                spec=None, preserved: frozenset[int] = frozenset()) -> Iterator[str]:
        """The reply's text pieces; preserved: control tokens its text keeps (Tokenizer.preserved_ids)."""
        if not ids:
            raise ValueError("the prompt is empty (and the model adds no BOS token)")
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"the prompt has {len(ids)} tokens; the context holds {self.n_ctx}")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        return self._generate_iter(ids, params, max_tokens, stops, constraint, spec, preserved)

    def _generate_iter(self, ids, params, max_tokens, stops, constraint=None, spec=None,
                       preserved: frozenset[int] = frozenset()) -> Iterator[str]:
        """Generation on the cached session (its prompt cache reused from the last call) when no
        other call holds it, else on a session of its own: calls from several threads, or a
        second call while a stream is open, each get their own sequence and the text they
        would get alone."""
        own = self._session_owner.acquire(blocking=False)
        if own:
            if self._session is None:
                self._session = Session(self)
            session = self._session
        else:
            session = Session(self)
        try:
            yield from self._generate_on(session, ids, params, max_tokens, stops, constraint, spec, preserved)
        finally:
            if own:
                self._session_owner.release()
            else:
                session.close()

    def _generate_on(self, session: Session, ids, params, max_tokens, stops, constraint=None,
                     spec=None, preserved: frozenset[int] = frozenset()) -> Iterator[str]:
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        if spec is not None:
            from . import speculative

            yield from speculative.generate(self, session, ids, params, max_tokens, stops, spec, stats, constraint,
                                            preserved)
            return
        session._set_llama_order(True)
        sampler = Sampler(params, self.n_vocab)
        detok = self.tokenizer.streaming_decoder(preserved=preserved)
        checker = StopChecker(stops)
        eog = self.tokenizer.eog_ids
        n_keep = 1 if (self.tokenizer.bos_id is not None and ids[0] == self.tokenizer.bos_id) else 0
        limit = max_tokens if max_tokens is not None and max_tokens >= 0 else None
        t0 = time.perf_counter()
        try:
            logits = session._prefill(ids)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):  # lands at the end of an n_batch step of the prompt
                stats.stop_reason, stats.prompt_tokens = "interrupted", len(session)
            session.reset()
            raise
        finally:
            stats.prompt_seconds = time.perf_counter() - t0
        history = list(ids)
        t1 = time.perf_counter()
        stats.stop_reason = "length"
        # -- constraint hook: a Guide samples under the constraint and appends forced tokens --
        guide = None
        if constraint is not None:
            from .constrain import Guide

            guide = Guide(constraint)
        # --
        try:
            while limit is None or stats.generated_tokens < limit:
                tok = sampler.sample(logits, history) if guide is None else guide.sample(sampler, logits, history)
                if tok in eog:
                    stats.stop_reason = "eog"
                    break
                new = [tok] if guide is None else guide.advance(
                    tok, None if limit is None else limit - stats.generated_tokens)
                done = False
                for t in new:
                    stats.generated_tokens += 1
                    history.append(t)
                    emit, done = checker.feed(detok.add(t))
                    if emit:
                        yield emit
                    if done:
                        break
                if done:
                    stats.stop_reason = "stop"
                    break
                if guide is not None and guide.constraint.finished:
                    stats.stop_reason = "grammar"
                    break
                if limit is not None and stats.generated_tokens >= limit:
                    break
                if len(session) + len(new) > session.n_ctx:
                    if limit is None and len(history) - len(ids) >= session.n_ctx:
                        break  # an unbounded reply as long as the whole context: stop
                    session._make_room(n_keep)
                logits = session._feed(new)
            if stats.stop_reason != "stop":
                tail, stopped = checker.feed(detok.flush())
                if not stopped:
                    tail += checker.flush()
                if tail:
                    yield tail
        except (KeyboardInterrupt, GeneratorExit):
            stats.stop_reason = "interrupted"
            raise
        finally:
            stats.decode_seconds = time.perf_counter() - t1
            if guide is not None:
                stats.forced_tokens = guide.forced

    def close(self) -> None:
        self._session = None
        self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"LLM({str(self.path)!r}, arch={self.config.arch}, n_ctx={self.n_ctx}, n_threads={self.n_threads})"
