"""`edgellm run FILE --system TEXT` chats with the tiny model of every architecture (tests/tiny_archs.py, built with
chat=True: the family's chat template and special token ids): the prompt that reaches the engine is
the conversation rendered with the file's own template and tokenized with its special tokens, and
the reply ends at the family's end-of-turn token - which is not printed, and which the template
writes back after the reply in the next turn.

The random weights choose no particular token, so the test decides what the model "says": the
logits the engine returns are left as they are for the first N_REPLY tokens of each reply but for
the end-of-generation tokens (banned, so the reply is N_REPLY greedy tokens), and from then on
favour the end-of-turn token. A chat that did not stop at it would feed it back and go on (the
decode steps are counted), or print its text."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

import tiny_archs
from edgellm import cli
from edgellm.api import Session

N_REPLY = 4
SYSTEM, USER = "Be brief.", ("Hello there", "And again?")
# The end of the first prompt (system prompt, one user message) as each family's template writes it
TAILS = {
    "qwen2": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "qwen3moe": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "qwen2moe": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    # Qwen 3.5's template opens the reply in thinking mode
    "qwen35": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "phi3": "<|user|>\nHello there<|end|>\n<|assistant|>\n",
    "phi4-mini": "<|user|>Hello there<|end|><|assistant|>",
    "smollm3": "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    # Gemma 2 has no system role: the system text is folded into the user's turn
    "gemma2": "<start_of_turn>user\nBe brief.\nHello there<end_of_turn>\n<start_of_turn>model\n",
    "granite": "<|start_of_role|>user<|end_of_role|>Hello there<|end_of_text|>\n"
               "<|start_of_role|>assistant<|end_of_role|>",
    "granitemoe": "<|start_of_role|>user<|end_of_role|>Hello there<|end_of_text|>\n"
                  "<|start_of_role|>assistant<|end_of_role|>",
    "olmo2": "<|user|>\nHello there\n<|assistant|>\n",
    "mistral3": "[/SYSTEM_PROMPT][INST]Hello there[/INST]",
    "llama-moe": "[INST]Be brief.\n\nHello there[/INST]",  # Nemo's: the system text opens the last user turn
    # Gemma 4: turns in <|turn> ... <turn|>; the model's turn opens with an empty thought channel
    "gemma4": "<|turn>user\nHello there<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
}


def test_every_architecture_has_a_chat_model():
    assert {tiny_archs.SPECS[n].arch for n in tiny_archs.CHATS} == {s.arch for s in tiny_archs.SPECS.values()}
    assert set(TAILS) == set(tiny_archs.CHATS)


@pytest.fixture
def scripted_engine(monkeypatch):
    """Records what reaches the engine and scripts the replies (see the module's docstring)."""
    rec = {"prompts": [], "decoded": [], "llm": None}
    prefill, feed, load = Session._prefill, Session._feed, cli._load

    def shaped(session, z):
        z = np.array(z, dtype=np.float32)
        eog = sorted(session._llm.tokenizer.eog_ids)
        if len(rec["decoded"][-1]) < N_REPLY:
            z[eog] = -np.inf
        else:
            z[rec["eot"]] = z.max() + 100.0
        return z

    def _prefill(self, ids):
        rec["prompts"].append(list(ids))
        rec["decoded"].append([])
        rec["in_prefill"] = True
        try:
            return shaped(self, prefill(self, ids))
        finally:
            rec["in_prefill"] = False

    def _feed(self, ids, **kw):
        out = feed(self, ids, **kw)
        if rec.get("in_prefill"):
            return out
        rec["decoded"][-1] += list(ids)
        return shaped(self, out)

    def _load(*a, **kw):
        rec["llm"] = load(*a, **kw)
        return rec["llm"]

    monkeypatch.setattr(Session, "_prefill", _prefill)
    monkeypatch.setattr(Session, "_feed", _feed)
    monkeypatch.setattr(cli, "_load", _load)
    return rec


def _streamed(llm, ids) -> str:
    """The text of ids as a reply streams it (an SPM reply's first word keeps its space)."""
    d = llm.tokenizer.streaming_decoder()
    return "".join(d.add(t) for t in ids) + d.flush()


@pytest.mark.parametrize("name", sorted(tiny_archs.CHATS))
def test_run_chats_with_the_files_template_and_stops_at_its_end_of_turn(tmp_path, scripted_engine, name):
    chat = tiny_archs.CHATS[name]
    path = tiny_archs.build(name, tmp_path, chat=True)
    rec = scripted_engine
    rec["eot"] = chat.eot
    res = CliRunner().invoke(cli.main, ["run", str(path), "--system", SYSTEM, "--temp", "0", "-n", "12", "-c", "1024", "-t", "2"],
                             input="\n".join(USER) + "\n/exit\n")
    assert res.exit_code == 0, res.output + str(res.exception)
    llm = rec["llm"]
    assert "no chat template" not in res.stderr
    eot_text = str(llm.gguf.metadata["tokenizer.ggml.tokens"][chat.eot])

    # each reply: N_REPLY tokens fed back, then the end-of-turn token chosen and not fed: stopped there
    assert [len(d) for d in rec["decoded"]] == [N_REPLY, N_REPLY], rec["decoded"]
    assert llm.last_stats.stop_reason == "eog"
    assert chat.eot in llm.tokenizer.eog_ids
    replies = [_streamed(llm, d) for d in rec["decoded"]]
    assert res.stdout.count("> ") == 3  # two turns, then /exit
    for reply in replies:
        assert reply + "\n" in res.stdout
    assert eot_text not in res.stdout and "[cut at" not in res.stdout

    # the prompts: the conversation so far in the file's own template, special tokens parsed
    t = llm.template
    system = {"role": "system", "content": SYSTEM}
    first = t.render([system, {"role": "user", "content": USER[0]}])
    assert first.endswith(TAILS[name]) and SYSTEM in first, first[-200:]
    assert rec["prompts"][0] == llm.chat_tokens(first)
    # a template that opens the reply in a thinking block (Qwen 3.5's) makes the unclosed reply
    # reasoning, which goes back as reasoning_content and which it leaves out of past turns
    thinking = TAILS[name].endswith("<think>\n")
    answer = ({"role": "assistant", "content": "", "reasoning_content": replies[0].strip()} if thinking
              else {"role": "assistant", "content": replies[0]})
    history = [system, {"role": "user", "content": USER[0]}, answer, {"role": "user", "content": USER[1]}]
    second = t.render(history)
    assert rec["prompts"][1] == llm.chat_tokens(second)
    # ... in which the template closes the first reply with the end-of-turn token
    said = "" if thinking else re.escape(replies[0].strip())
    assert re.search(said + r"\s*" + re.escape(eot_text), second), second[-300:]
    assert not thinking or replies[0].strip() not in second
    ids = rec["prompts"][1]
    n_eot = ids.count(chat.eot) - rec["prompts"][0].count(chat.eot)
    assert n_eot >= 1
