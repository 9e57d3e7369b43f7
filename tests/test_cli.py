"""The `edgellm` command: `run` driven in a real pseudo-terminal, `generate` against llama.cpp's
greedy text, and bad input turned into one readable line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pexpect
import pytest

from conftest import REFERENCE, default_sigint
from edgellm.quants import QType
from tiny_models import tiny_model

CMD = [sys.executable, "-m", "edgellm"]


def run_cli(*args, timeout=600, **kw):
    return subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", "llama", QType.Q8_0)


@pytest.mark.real
def test_generate_prints_llamacpp_greedy_text(smollm2_path):
    """`edgellm generate --temp 0` prints llama.cpp's greedy text: on the fixture prompt with the
    longest stretch where each step's best token leads the next by > 0.3 (where summation order
    cannot flip the choice; see test_real_models for why near ties may), for that many tokens."""
    import numpy as np

    import edgellm

    ref = json.loads((REFERENCE / "smollm2-135m-instruct-q4_1.public.json").read_text())
    llm = edgellm.LLM(smollm2_path, n_ctx=256)
    best = (0, None)
    for case in ref["greedy"]:
        s = llm.session()
        logits, n = s.feed(case["prompt_ids"]), 0
        for want in case["continuation_ids"]:
            top2 = np.sort(logits)[-2:]
            if top2[1] - top2[0] <= 0.3 or int(np.argmax(logits)) != want:
                break
            n += 1
            logits = s.feed([want])
        best = max(best, (n, case), key=lambda b: b[0])
    n, case = best
    assert n >= 4, f"no fixture prompt has 4 clear greedy steps (longest: {n})"
    r = run_cli("generate", str(smollm2_path), "-p", case["prompt"], "-n", str(n), "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == llm.detokenize(case["continuation_ids"][:n]) + "\n"


def spawn(*args, **kw):
    """`edgellm ARGS` on a pseudo-terminal wide enough that readline never scrolls the typed line
    (its echo is then exactly what was typed)."""
    return pexpect.spawn(CMD[0], CMD[1:] + list(args), encoding="utf-8", dimensions=(24, 500),
                         preexec_fn=default_sigint, **kw)


# Every wait below names text that only the step it waits for prints: the verbose speed line
# (after an answer), the chat's own messages, the echo of a typed line. None waits for time to pass.


@pytest.mark.real
def test_run_chat_in_a_terminal(smollm2_path):
    """Two turns, an answer interrupted with Ctrl-C (the chat goes on), /reset, then /exit."""
    # -n 0: no answer limit; the story (greedy) then runs for thousands of tokens, so Ctrl-C,
    # sent as soon as its first words are seen, arrives while it is being written
    child = spawn("run", str(smollm2_path), "--temp", "0", "-n", "0", "-v",
                  env=dict(os.environ, TERM="dumb"), timeout=300)
    try:
        child.expect("Type /help")
        child.expect("> ")
        assert "no chat template" not in child.before  # SmolLM2 carries its own
        child.sendline("What is the capital of France? Answer in one word.")
        child.expect(r"tok/s")  # --verbose speed line after the answer
        first = child.before
        assert "Paris" in first
        child.expect("> ")
        child.sendline("And of Italy?")
        child.expect("tok/s")
        assert "Rome" in child.before
        child.expect("> ")
        story = "Write a very long story about a dragon who learns to cook."
        child.sendline(story)
        child.expect_exact(story)  # the terminal's echo of the typed line...
        child.expect(r"\w+ \w+ \w+")  # ...then the answer's first words: it is streaming
        child.sendintr()
        child.expect(r"\[stopped\]")
        child.expect("> ")
        child.sendline("/help")
        child.expect("/reset")
        child.expect("> ")
        child.sendline("/reset")
        child.expect("conversation cleared")
        child.expect("> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


@pytest.mark.real
def test_run_leaves_on_ctrl_d(smollm2_path):
    child = spawn("run", str(smollm2_path), timeout=120)
    try:
        child.expect("> ")  # readline has the terminal from before it prints the prompt
        child.sendintr()  # Ctrl-C at the prompt does not leave
        child.expect("Ctrl-D")
        child.expect("> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_generate_on_tiny_model(tiny_path):
    r = run_cli("generate", str(tiny_path), "-p", "the cat", "-n", "5", "--temp", "0", "-v")
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stderr


def test_cache_types_on_every_command(tiny_path, tmp_path):
    """-ctk / -ctv reach the model on generate, bench (with -d) and perplexity; a bad name is one line."""
    r = run_cli("generate", str(tiny_path), "-p", "the cat", "-n", "3", "--temp", "0", "-ctk", "q8_0", "-ctv", "q4_0")
    assert r.returncode == 0, r.stderr
    r = run_cli("bench", str(tiny_path), "-p", "8", "-n", "4", "-d", "0,40", "-r", "1", "-ctk", "q4_0", "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert [(x["test"], x["depth"], x["cache_types"]) for x in rows] == [
        ("pp8", 0, "q4_0/f16"), ("tg4", 0, "q4_0/f16"), ("pp8 @ d40", 40, "q4_0/f16"), ("tg4 @ d40", 40, "q4_0/f16")]
    assert rows[3]["kv_bytes_per_token"] > rows[1]["kv_bytes_per_token"] > 0
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 40)
    r = run_cli("perplexity", str(tiny_path), "-f", str(text), "-c", "32", "--chunks", "2", "-ctv", "q8_0")
    assert r.returncode == 0 and "Final estimate: PPL" in r.stdout, r.stderr
    r = run_cli("generate", str(tiny_path), "-p", "x", "-ctk", "q5_9")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "q5_9" in r.stderr


@pytest.mark.parametrize("make_bad", ["missing", "garbage", "truncated", "directory"])
def test_bad_model_file_is_one_line(tmp_path, tiny_path, make_bad):
    p = tmp_path / "m.gguf"
    if make_bad == "garbage":
        p.write_bytes(b"not a gguf file at all" * 10)
    elif make_bad == "truncated":
        p.write_bytes(tiny_path.read_bytes()[:5000])
    elif make_bad == "directory":
        p.mkdir()
    r = run_cli("generate", str(p), "-p", "x", "-n", "1")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr


def test_prompt_longer_than_context_is_one_line(tiny_path):
    r = run_cli("generate", str(tiny_path), "-p", "the cat sat on the mat " * 20, "-n", "1", "-c", "16")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "context" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_alias(tmp_path):
    r = run_cli("generate", "no-such-model", "-p", "x", env=dict(os.environ, EDGELLM_HOME=str(tmp_path)))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no-such-model" in r.stderr


def test_models_lists_aliases():
    r = run_cli("models")
    assert r.returncode == 0
    assert "smollm2-135m-instruct" in r.stdout and "gemma3-270m" in r.stdout


def test_long_chat_keeps_going(tiny_path):
    """A conversation longer than the context: the oldest turns are dropped, the chat goes on.
    (Lines come from a pipe: this is about the conversation, not the terminal.)"""
    lines = ["the cat sat on the mat the dog sat on the mat"] * 6 + ["/exit"]
    r = run_cli("run", str(tiny_path), "-c", "64", "-n", "6", "--temp", "0", "-v", input="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert "oldest turn was dropped" in r.stderr
    assert "error" not in r.stderr
    assert r.stderr.count("[prompt: ") == 6  # every turn was answered (-v's line after each answer)

    child = pexpect.spawn(CMD[0], CMD[1:] + ["run", str(tiny_path), "-c", "64", "-n", "6", "--temp", "0"],
                          encoding="utf-8", timeout=120)
    child.logfile_read = log = io.StringIO()
    try:
        child.expect("> ")
        for _ in range(6):
            child.sendline("the cat sat on the mat the dog sat on the mat")
            child.expect("> ")
        assert "oldest turn was dropped" in log.getvalue()
        assert "error" not in log.getvalue()
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_run_prompt_cache_reopens_the_chat(tiny_path, tmp_path):
    """`run --prompt-cache FILE` saves the chat after each answer; a second run reopens it (its
    history and cache) and the next answer is the one the first run would have given."""
    import io

    def chat(lines, cache):
        child = pexpect.spawn(CMD[0], CMD[1:] + ["run", str(tiny_path), "-c", "256", "-n", "5", "--temp", "0"] +
                              (["--prompt-cache", str(cache)] if cache else []), encoding="utf-8", timeout=120)
        child.logfile_read = log = io.StringIO()
        try:
            child.expect("> ")
            for line in lines:
                child.sendline(line)
                child.expect("> ")
            child.sendline("/exit")
            child.expect(pexpect.EOF)
        finally:
            child.close()
        assert child.exitstatus == 0, log.getvalue()
        return log.getvalue()

    cache = tmp_path / "chat.state"
    one = chat(["the cat sat", "on the mat"], None)
    chat(["the cat sat"], cache)
    two = chat(["on the mat"], cache)
    assert "reopened a chat of 1 turns" in two
    assert one.rsplit("on the mat", 1)[1].split(">")[0] == two.rsplit("on the mat", 1)[1].split(">")[0]
    cache.write_bytes(cache.read_bytes()[:-10])
    r = run_cli("run", str(tiny_path), "--prompt-cache", str(cache), input="")
    assert r.returncode == 1 and "corrupt or truncated" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ rough edges


@pytest.mark.parametrize("command", ["run", "generate"])
@pytest.mark.parametrize("args, option", [
    (["--temp", "-1"], "--temp"), (["--temp", "nan"], "--temp"), (["--top-k", "-1"], "--top-k"),
    (["--top-p", "0"], "--top-p"), (["--top-p", "1.5"], "--top-p"), (["--min-p", "2"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"), (["--frequency-penalty", "inf"], "--frequency-penalty"),
    (["--seed", "-1"], "--seed"), (["-n", "-5"], "--max-tokens"), (["-c", "-1"], "--ctx-size"),
    (["-t", "0"], "--threads"),
])
def test_invalid_values_are_refused_before_loading(tmp_path, command, args, option):
    """One line naming the option, before the model is looked at: the model path does not exist,
    so an error about the file would mean the value was checked too late."""
    missing = str(tmp_path / "absent.gguf")
    argv = [command, missing, *(["-p", "x"] if command == "generate" else []), *args]
    r = run_cli(*argv)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Invalid value for ") and option in lines[0], r.stderr
    assert "absent.gguf" not in r.stderr and "n_batch" not in r.stderr


def test_usage_errors_are_one_line():
    for argv, words in ((["run", "--bogus"], "No such option '--bogus'"),
                        (["generate", "m"], "Missing option '-p'"), (["nosuch"], "No such command")):
        r = run_cli(*argv)
        assert r.returncode == 2
        assert r.stderr.splitlines() == [r.stderr.strip()] and words in r.stderr, r.stderr
        assert "--help" in r.stderr  # where to look instead of the usage block


def test_error_after_loading_has_no_blank_line(tiny_path):
    """An error found once the model is loaded (the prompt does not fit): nothing on stdout,
    one line on stderr."""
    r = run_cli("generate", str(tiny_path), "-p", "the cat sat on the mat " * 20, "-n", "1", "-c", "16")
    assert r.returncode == 1
    assert r.stdout == "" and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, (r.stdout, r.stderr)


def test_chat_error_has_no_blank_line(tiny_path):
    """In the chat, a message that cannot fit is reported on one line and the chat goes on."""
    r = run_cli("run", str(tiny_path), "-c", "16", input="the cat sat on the mat " * 20 + "\n/exit\n")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("error: "))
    assert "context" in lines[at] and lines[at - 1].strip() != "", r.stderr


def test_model_without_chat_template_is_warned_about(tiny_path):
    """The tiny model carries no chat template (as gemma3-270m, a base model): `run` says so."""
    r = run_cli("run", str(tiny_path), input="/exit\n")
    assert r.returncode == 0
    warning = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warning) == 1 and "no chat template" in warning[0] and "base model" in warning[0]


def test_chat_answers_have_a_default_limit(tiny_path):
    text = " ".join(run_cli("run", "--help").stdout.split())
    assert "(0 = until the context is full). [default: 1024" in text
    # with -n 3, the answer stops after 3 tokens and says why (greedy: the tiny model writes no EOS
    # in its first 3 tokens for this line)
    r = run_cli("run", str(tiny_path), "-n", "3", "--temp", "0", "-v", input="hello world\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "answer: 3 tok" in r.stderr and "[cut at 3 tokens: -n sets the limit]" in r.stdout


def test_one_thread_is_singular(tiny_path):
    r = run_cli("generate", str(tiny_path), "-p", "the cat", "-n", "2", "-t", "1", "-v")
    assert r.returncode == 0, r.stderr
    assert ", 1 thread]" in r.stderr


def test_models_aligns_unknown_sizes(tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text('default = "known"\n'
                    '[models.known]\ndescription = "d"\nfile = "k.gguf"\nsize = 98362432\n'
                    '[models.unknown]\ndescription = "d"\nfile = "u.gguf"\n')
    r = run_cli("models", env=dict(os.environ, EDGELLM_MODELS_TOML=str(toml), EDGELLM_HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[:2]
    assert len(rows) == 2 and "    98 MB" in rows[0] and "     ? MB" in rows[1]
    assert rows[0].index(" MB") == rows[1].index(" MB")


def test_stats_line_after_an_interrupted_prompt():
    """Ctrl-C in the prompt: how many tokens went in, and no 0.0 tok/s for an answer that has none."""
    from types import SimpleNamespace

    from edgellm.api import GenerationStats
    from edgellm.cli import _stats_line

    llm = SimpleNamespace(n_threads=2, backend="c", last_stats=GenerationStats(
        prompt_tokens=512, prompt_seconds=2.0, stop_reason="interrupted"))
    assert _stats_line(llm) == "[prompt: 512 tok evaluated, then stopped, 256.0 tok/s | answer: 0 tok | c, 2 threads]"
    llm.last_stats = GenerationStats(prompt_tokens=40, prompt_seconds=0.5, generated_tokens=10, decode_seconds=1.0,
                                     stop_reason="interrupted")
    assert _stats_line(llm) == "[prompt: 40 tok, 80.0 tok/s | answer: 10 tok, 10.0 tok/s | c, 2 threads]"


def test_a_warning_is_one_line(tiny_path):
    """A warning from the CLI is its text on one line, not Python's file, line and source line."""
    r = run_cli("generate", str(tiny_path), "-p", "the cat", "-n", "1", "--temp", "0", "-t", "999")
    assert r.returncode == 0, r.stderr
    warning = [ln for ln in r.stderr.splitlines() if "threads requested" in ln]
    assert len(warning) == 1 and warning[0].startswith("warning: "), r.stderr
    assert ".py:" not in r.stderr and "return LLM(" not in r.stderr, r.stderr
