"""The `edgellm` command: a thin shell over edgellm.api.

    edgellm run [MODEL]              chat in the terminal (default model from models.toml)
    edgellm generate MODEL -p TEXT   print a completion
    edgellm serve [MODEL]            an OpenAI-compatible HTTP server
    edgellm models | pull ALIAS      what we know / fetch it
"""

from __future__ import annotations

import functools
import os
import sys

# edgellm computes on its own thread pool; numpy's BLAS threads (never used here) would only
# compete with it for the cores. Set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
from pathlib import Path

import click

from . import __version__
from .cli_options import cache_type_options, cache_types
from .errors import EdgeLLMError
from .kernels import isa_label

CHAT_MAX_TOKENS = 1024  # `edgellm run`'s longest answer unless -n says otherwise: a looping answer ends

HELP_TEXT = """Commands:
  /help          show this help
  /reset         forget the conversation (keeps the system prompt)
  /exit, /quit   leave (or press Ctrl-D)
Ctrl-C stops the answer being written; Ctrl-D on an empty line leaves."""


class _Group(click.Group):
    """The `edgellm` group: a usage error (bad option value, unknown option, missing argument) is
    one line, "Error: ..." naming the option, instead of click's usage block."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            raise _one_line(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise _one_line(e) from None


def _one_line(e: click.UsageError) -> click.UsageError:
    text = e.format_message()
    if e.ctx is not None and (isinstance(e, click.MissingParameter) or not isinstance(e, click.BadParameter)):
        text += f" (see '{e.ctx.command_path} --help')"  # a bad value needs no pointer to the help
    return click.UsageError(text)  # without a context, show() prints no usage block


def _user_errors(fn):
    """EdgeLLMError and bad values become one readable line and exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgeLLMError as exc:
            raise click.ClickException(str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)

    return wrapper


def _sampling_check(field: str):
    """Option callback: the value must be one SamplingParams accepts (its checks are the one table
    of what is valid), so a bad value is refused before the model is loaded. The CLI's top-k says
    "0 = off", so it refuses the negative values the API also reads as off."""

    def check(ctx, param, value):
        if value is not None:
            from .sampling import SamplingParams

            if field == "top_k" and value < 0:
                raise click.BadParameter(f"top_k must be >= 0 (0 disables it), got {value}", ctx, param)
            try:
                SamplingParams(**{field: value})
            except ValueError as e:
                raise click.BadParameter(str(e), ctx, param) from None
        return value

    return check


def _sampling_options(fn):
    def opt(*names, field, type, help):
        return click.option(*names, field, type=type, default=None, help=help, callback=_sampling_check(field))

    options = [
        opt("--temp", field="temperature", type=float, help="Temperature (0 = greedy). [0.8]"),
        opt("--top-k", field="top_k", type=int, help="Keep the k most likely tokens (0 = off). [40]"),
        opt("--top-p", field="top_p", type=float, help="Nucleus sampling mass (1 = off). [0.95]"),
        opt("--min-p", field="min_p", type=float, help="Drop tokens below min_p x the top probability. [0.05]"),
        opt("--repeat-penalty", field="repeat_penalty", type=float, help="Penalty for repeated tokens (1 = off). [1.0]"),
        opt("--frequency-penalty", field="frequency_penalty", type=float, help="Subtract count x this. [0]"),
        opt("--presence-penalty", field="presence_penalty", type=float, help="Subtract this once a token appeared. [0]"),
        opt("--seed", field="seed", type=int, help="Random seed (same seed, same text)."),
    ]
    for o in reversed(options):
        fn = o(fn)
    return fn


_MLOCK_OPTION = click.option("--mlock", is_flag=True,
                             help="Lock the weights in RAM (mlock) so they are never paged out.")


def _model_options(fn):
    options = [
        click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=0), default=4096, show_default=True,
                     help="Context length in tokens (0 = the model's)."),
        click.option("-t", "--threads", "n_threads", type=click.IntRange(min=1), default=None,
                     help="Threads (default: physical cores)."),
        _MLOCK_OPTION,
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return cache_type_options(fn)


def _llm_options(kw: dict) -> dict:
    """The LLM arguments of _model_options' options beside -c and -t, popped from kw."""
    return {**cache_types(kw), "mlock": kw.pop("mlock", False)}


def _speculative_options(fn):
    options = [
        click.option("--lookup", is_flag=True, help="Speculative decoding with prompt lookup (n-grams of the text so far)."),
        click.option("--draft", "draft", default=None, metavar="MODEL",
                     help="Speculative decoding with this draft model (same vocabulary)."),
        click.option("--draft-max", type=click.IntRange(1, 64), default=None,
                     help="Most draft tokens per step (default 16 with --lookup, 8 with --draft)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _speculative(llm, kw: dict):
    """The speculative= argument from --lookup / --draft / --draft-max (checked now: a draft
    model with another vocabulary is refused before anything is generated; llm None: left for
    the server to resolve once it has loaded the model)."""
    from .speculative import Speculative, resolve

    lookup, draft, k = kw.pop("lookup"), kw.pop("draft"), kw.pop("draft_max")
    if lookup and draft:
        raise click.UsageError("give --lookup or --draft, not both")
    if not lookup and not draft:
        if k is not None:
            raise click.UsageError("--draft-max needs --lookup or --draft")
        return None
    spec = Speculative("lookup" if lookup else draft, max_draft=k)
    return spec if llm is None else resolve(llm, spec)


def _sampling(kw: dict) -> dict:
    keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty", "seed")
    return {k: kw.pop(k) for k in keys if k in kw}


def _load(model: str, n_ctx: int, n_threads, seed=None, **llm_kw):
    from .api import LLM

    return LLM(model, n_ctx=n_ctx, n_threads=n_threads, seed=seed, progress=True, **llm_kw)


def _stats_line(llm, spec=None) -> str:
    """Speeds of the last answer (and with speculation, how many drafts were taken); an
    interrupted prompt says how far it got, and no speed is given for what has no tokens."""
    s, n = llm.last_stats, llm.n_threads
    stopped = s.stop_reason == "interrupted" and not s.generated_tokens
    prompt = f"prompt: {s.prompt_tokens} tok{' evaluated, then stopped' if stopped else ''}"
    prompt += f", {s.prompt_tps:.1f} tok/s" if s.prompt_tokens else ""
    answer = f"answer: {s.generated_tokens} tok" + (f", {s.decode_tps:.1f} tok/s" if s.generated_tokens else "")
    if spec is not None:
        answer += (f" | drafts: {s.accepted_tokens}/{s.draft_tokens} accepted ({s.acceptance_rate:.0%}), "
                   f"{s.mean_accepted:.2f} per step")
    return f"[{prompt} | {answer} | {isa_label(llm.backend)}, {n} thread{'' if n == 1 else 's'}]"


def _limit(max_tokens: int):
    """-n as the API's max_tokens: 0 means no limit (generation then ends with the context)."""
    return max_tokens or None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgellm")
def main():
    """Run GGUF language models fast on this CPU."""
    import warnings

    # a warning is one line of its text, not Python's file, line number and source line
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {message}\n"


@main.command()
@click.argument("model", required=False)
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=CHAT_MAX_TOKENS, show_default=True,
              help="Longest answer in tokens (0 = until the context is full).")
@click.option("-v", "--verbose", is_flag=True, help="Show prompt and decode speed after each answer.")
@click.option("--prompt-cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Reopen the chat saved in this file (its history and KV cache, not evaluated again) and save "
                   "it there after every answer.")
@_model_options
@_sampling_options
@_speculative_options
@_user_errors
def run(model, system, max_tokens, verbose, prompt_cache, n_ctx, n_threads, mlock, **kw):
    """Chat with MODEL (an alias from `edgellm models`, or a .gguf path) in the terminal."""
    from .registry import default_alias

    try:  # line editing and history where the platform has it
        import readline  # noqa: F401
    except ImportError:
        pass
    model = model or default_alias()
    sampling = _sampling(kw)
    llm = _load(model, n_ctx, n_threads, sampling.get("seed"), mlock=mlock, **cache_types(kw))
    spec = _speculative(llm, kw)
    if spec is not None:
        sampling["speculative"] = spec
    click.echo(f"edgellm {__version__} - {llm.path.name} ({llm.config.arch}, {isa_label(llm.backend)}). "
               "Type /help for commands, Ctrl-D to leave.", err=True)
    if llm.template.is_builtin:
        click.echo(f"warning: {llm.path.name} carries no chat template, so it is probably a base model that "
                   "was not trained to chat; its answers (in edgellm's built-in template) may ramble or loop. "
                   "`edgellm generate` completes plain text.", err=True)
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    if prompt_cache is not None and prompt_cache.exists():
        meta = llm.load_state(prompt_cache)
        if not isinstance(meta, dict) or not isinstance(meta.get("messages"), list):
            raise click.ClickException(f"{prompt_cache} holds no chat (was it saved by edgellm run?)")
        messages = meta["messages"]
        base = [m for m in messages[:1] if m.get("role") == "system"]
        click.echo(f"(reopened a chat of {sum(m.get('role') == 'user' for m in messages)} turns from "
                   f"{prompt_cache})", err=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            click.echo("")
            return
        except KeyboardInterrupt:
            click.echo("\n(Ctrl-D or /exit leaves)")
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd = text.split()[0].lower()
            if cmd in ("/exit", "/quit", "/bye"):
                return
            if cmd == "/help":
                click.echo(HELP_TEXT)
            elif cmd == "/reset":
                messages = list(base)
                click.echo("(conversation cleared)")
            else:
                click.echo(f"unknown command {cmd}; /help lists them")
            continue
        messages.append({"role": "user", "content": line})
        answer, turn = [], None
        try:
            stream, turn = _chat_within_context(llm, messages, base, _limit(max_tokens), sampling)
            for piece in stream:
                answer.append(piece)
                click.echo(piece, nl=False)
            if llm.last_stats.stop_reason == "length":
                click.echo(f" [cut at {max_tokens} tokens: -n sets the limit]" if max_tokens
                           else " [cut: the answer filled the context]", nl=False)
        except KeyboardInterrupt:
            click.echo(" [stopped]", nl=False)
        except EdgeLLMError as exc:
            click.echo(("\n" if answer else "") + f"error: {exc}", err=True)
            messages.pop()
            continue
        click.echo("")
        messages.append(_history_message(turn, "".join(answer)))
        if prompt_cache is not None:
            llm.save_state(prompt_cache, meta={"messages": messages})
        if verbose:
            click.echo(_stats_line(llm, spec), err=True)


def _history_message(turn, text: str) -> dict:
    """The answer as the history keeps it: read back by its turn (ChatTurn.message), so the
    format's markers the reply's text keeps (Command R7B's <|START_RESPONSE|>, a <think> block)
    are not rendered a second time by the template, and the reasoning goes back as
    reasoning_content, as a server's client would send it."""
    if turn is None:  # (interrupted before the reply began)
        return {"role": "assistant", "content": text}
    msg, _ = turn.message(text, "stop")
    content = msg.get("content") or ""
    # a reply with nothing to take out is kept as written, its spaces too (the reading strips
    # them): the next prompt then starts with the tokens already in the cache
    if msg.get("reasoning_content") is None and content == text.strip():
        content = text
    kept = {"role": "assistant", "content": content}
    if msg.get("reasoning_content") is not None:
        kept["reasoning_content"] = msg["reasoning_content"]
    return kept


def _chat_within_context(llm, messages: list, base: list, max_tokens, sampling):
    """Start the reply (its text pieces and its ChatTurn); when the conversation no longer fits
    the context, forget its oldest turns (never the system prompt or the new message) and say
    so, so a long chat goes on."""
    from .errors import ContextOverflowError

    while True:
        try:
            return llm._chat(messages, stream=True, max_tokens=max_tokens, **sampling)
        except ContextOverflowError:
            if len(messages) <= len(base) + 1:
                raise
            del messages[len(base):len(base) + 2]  # the oldest user turn and its answer
            click.echo("(the oldest turn was dropped to fit the context)", err=True)


@main.command()
@click.argument("model")
@click.option("-p", "--prompt", required=True, help="Text to complete ('-' reads standard input).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=128, show_default=True,
              help="Tokens to generate (0 = until the context is full).")
@click.option("--stop", multiple=True, help="Stop before this text (repeatable).")
@click.option("--grammar-file", type=click.Path(exists=True, dir_okay=False),
              help="Constrain the output to a GBNF grammar (llama.cpp's format) read from this file.")
@click.option("--json-schema", help="Constrain the output to JSON following this schema (JSON text, or a file).")
@click.option("--regex", help="Constrain the output to text matching this regular expression.")
@click.option("-v", "--verbose", is_flag=True, help="Print speed figures to stderr.")
@_model_options
@_sampling_options
@_speculative_options
@_user_errors
def generate(model, prompt, max_tokens, stop, grammar_file, json_schema, regex, verbose, n_ctx, n_threads, mlock,
             **kw):
    """Print MODEL's completion of a prompt."""
    if prompt == "-":
        prompt = sys.stdin.read()
    constraint = _constraint_options(grammar_file, json_schema, regex)
    sampling = _sampling(kw)
    llm = _load(model, n_ctx, n_threads, sampling.get("seed"), mlock=mlock, **cache_types(kw))
    spec = _speculative(llm, kw)
    stream = llm.generate(prompt, max_tokens=_limit(max_tokens), stop=list(stop), stream=True, speculative=spec,
                          **constraint, **sampling)
    printed = ended = False
    try:
        for piece in stream:
            click.echo(piece, nl=False)
            printed = True
        ended = True
    finally:  # end the text's line, but print no empty line before an error message
        if printed or ended:
            click.echo("")
    if verbose:
        click.echo(_stats_line(llm, spec), err=True)
    if constraint and llm.last_stats.stop_reason == "length":
        raise click.ClickException(f"the output was cut at {max_tokens} tokens before it was complete (-n)")


def _constraint_options(grammar_file, json_schema, regex) -> dict:
    """generate()'s constraint keywords from the command line, checked before the model loads."""
    from .constrain import Grammar

    out = {}
    if grammar_file:
        with open(grammar_file, encoding="utf-8") as f:
            out["grammar"] = f.read()
    if json_schema is not None:
        text = json_schema
        if not text.lstrip().startswith(("{", "[")) and os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        out["json_schema"] = text
    if regex is not None:
        out["regex"] = regex
    if out:
        out = {"grammar": Grammar.from_options(**out)}  # errors now, not after loading the model
    return out


@main.command()
@click.argument("model", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: any free one).")
@click.option("--parallel", "-np", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Sequences decoded at once.")
@click.option("--max-queue", type=click.IntRange(0), default=128, show_default=True,
              help="Requests that may wait for a slot; more get 429 with Retry-After.")
@click.option("--kv-tokens", type=click.IntRange(16), default=None,
              help="KV cache tokens all sequences share (default: parallel x context); their memory is taken at startup.")
@click.option("--lazy-kv", is_flag=True,
              help="Take the KV cache's memory as it is first written, not at startup (it grows as the prefix cache fills).")
@click.option("--api-key", envvar="EDGELLM_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (or set EDGELLM_API_KEY); /health stays open.")
@click.option("--grace", type=click.IntRange(0), default=30, show_default=True,
              help="Seconds running requests get to finish on SIGTERM / Ctrl-C.")
@click.option("--chat-template-file", type=click.Path(exists=True, dir_okay=False),
              help="Render chats with this Jinja template instead of the model's own.")
@click.option("-v", "--verbose", is_flag=True, help="Log every request.")
@_model_options
@_speculative_options
@_user_errors
def serve(model, host, port, parallel, max_queue, kv_tokens, lazy_kv, api_key, grace, chat_template_file, verbose,
          n_ctx, n_threads, **kw):
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...)."""
    try:
        from .server.runner import serve as run_server
    except ImportError as exc:
        raise click.ClickException(f"the server needs its extra: pip install 'edgellm[server]' ({exc})") from None
    from .registry import default_alias

    if api_key is not None and not api_key.strip():
        raise click.BadParameter("must not be empty", param_hint="--api-key")
    chat_template = None
    if chat_template_file:
        with open(chat_template_file, encoding="utf-8") as f:
            chat_template = f.read()
    run_server(model or default_alias(), host=host, port=port, parallel=parallel, n_ctx=n_ctx, n_threads=n_threads,
               kv_tokens=kv_tokens, lazy_kv=lazy_kv, api_key=api_key, max_queue=max_queue, grace=grace, verbose=verbose,
               chat_template=chat_template, speculative=_speculative(None, kw), **_llm_options(kw))


@main.command()
@_user_errors
def models():
    """List the models edgellm knows (models.toml) and which are cached."""
    from .registry import home, list_models

    entries = list_models()
    width = max(len(e.alias) for e in entries) if entries else 10
    for e in entries:
        mark = "*" if e.default else " "
        size = f"{e.size / 1e6:6.0f} MB" if e.size else f"{'?':>6} MB"
        state = "cached" if e.cached else "-"
        note = "" if e.verified else " (no sha256 pinned: not verified)"
        click.echo(f"{mark} {e.alias:<{width}}  {size}  {state:<6}  {e.description}{note}")
    click.echo(f"(* default; cache: {home() / 'models'})")


@main.command()
@click.argument("alias")
@click.option("--force", is_flag=True, help="Fetch again even if cached.")
@_user_errors
def pull(alias, force):
    """Fetch ALIAS into the cache (verifying its sha256)."""
    from .registry import pull as _pull

    try:
        path = _pull(alias, progress=True, force=force)
    except KeyboardInterrupt:
        click.echo(f"\nedgellm: pull interrupted; {alias} is not in the cache. `edgellm pull {alias}` "
                   "goes on from the files already downloaded.", err=True)
        sys.exit(130)
    click.echo(str(path))


def _counts(what: str, default):
    """Option callback: comma-separated positive integers (`default` when the option is absent)."""

    def parse(ctx, param, value):
        if value is None:
            return default
        try:
            counts = [int(x) for x in value.split(",")]
        except ValueError:
            raise click.BadParameter("expected comma-separated integers, e.g. 1,2", ctx, param) from None
        if any(c <= 0 for c in counts):
            raise click.BadParameter(f"{what} must be positive", ctx, param)
        return counts

    return parse


@main.command()
@click.argument("model")
@click.option("-p", "--n-prompt", type=click.IntRange(min=0), default=512, show_default=True,
              help="Prompt tokens (pp test; 0 = skip).")
@click.option("-n", "--n-gen", type=click.IntRange(min=0), default=128, show_default=True,
              help="Generated tokens (tg test; 0 = skip).")
@click.option("-t", "--threads", "counts", default=None, callback=_counts("thread counts", [None]),
              help="Comma-separated thread counts (default: physical cores).")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed runs per test.")
@click.option("-o", "--output", type=click.Choice(["md", "json"]), default="md", show_default=True)
@click.option("--batch", "batches", default=None, callback=_counts("sequence counts", None),
              help="Comma-separated sequence counts, e.g. 1,4,8,16,32: llama-batched-bench's test instead "
                   "(B sequences, pp N_PROMPT each, then tg N_GEN each; S_PP, S_TG, total).")
@click.option("--scheduler", is_flag=True, help="With --batch: go through BatchEngine (greedy sampling) too.")
@click.option("-d", "--depth", "depths", default="0", show_default=True,
              help="Comma-separated context depths: the tests run after a context of this many tokens "
                   "(llama-bench's -d).")
@cache_type_options
@_MLOCK_OPTION
@_user_errors
def bench(model, n_prompt, n_gen, counts, repetitions, output, batches, scheduler, depths, mlock, **kw):
    """Measure prompt (pp) and generation (tg) speed the way llama-bench does (with --batch, the
    way llama-batched-bench does)."""
    from . import bench as b

    try:
        depth_list = [int(x) for x in depths.split(",")]
    except ValueError:
        raise click.BadParameter("expected comma-separated integers, e.g. 0,8000", param_hint="-d") from None
    if any(x < 0 for x in depth_list):
        raise click.BadParameter("depths must be >= 0", param_hint="-d")
    if batches is not None:
        if depth_list != [0] or kw.get("cache_type_k", "f16") != "f16" or kw.get("cache_type_v", "f16") != "f16":
            raise click.BadParameter("--batch measures an empty f16 cache (no -d, -ctk or -ctv)")
        results = []
        for t in counts:
            results += b.run_batched(model, batches=batches, n_prompt=n_prompt, n_gen=n_gen, threads=t,
                                     reps=repetitions, scheduler=scheduler, mlock=mlock,
                                     progress=(lambda r: click.echo(f"B={r.n_seqs}: S_TG {r.s_tg:.1f} t/s", err=True)))
        click.echo(b.markdown_batched(results) if output == "md" else
                   json.dumps({"results": [r.as_dict() for r in results]}, indent=2))
        return
    results = b.run(model, n_prompt=n_prompt, n_gen=n_gen, threads=counts, reps=repetitions, mlock=mlock,
                    depths=depth_list,
                    progress=(lambda r: click.echo(f"{r.test} t={r.threads}: {r.mean:.2f} t/s", err=True))
                    if output == "md" else None, **cache_types(kw))
    click.echo(b.markdown(results) if output == "md" else b.to_json(results))


from .tools.commands import info, perplexity, quantize  # noqa: E402 - after `main`, whose group they join

for _cmd in (quantize, perplexity, info):
    main.add_command(_cmd)

if __name__ == "__main__":
    main()
