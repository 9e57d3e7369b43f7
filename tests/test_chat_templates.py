"""Every chat template in llama.cpp's models/templates/ renders what Hugging Face transformers'
apply_chat_template renders for the same conversations (tests/fixtures/templates, made by
scripts/make_template_fixtures.py): chat, a system message (folded into the next message for
templates without a system role, as llama.cpp does), and tools with a call and its result."""

from __future__ import annotations

import hashlib
import json

import pytest

import template_cases as cases
from conftest import FIXTURES
from edgellm import chat_sandbox
from edgellm.chat import ChatTemplate
from edgellm.errors import TemplateError
from llamacpp_source import models_dir

RENDERS = json.loads((FIXTURES / "templates" / "renders.json").read_text(encoding="utf-8"))["templates"]


@pytest.fixture(scope="module")
def templates_dir():
    return models_dir() / "templates"


@pytest.fixture
def fixed_clock(monkeypatch):
    from datetime import datetime

    clock = datetime(*cases.FIXED_DATE)
    monkeypatch.setitem(chat_sandbox.SANDBOX.globals, "strftime_now", lambda fmt: clock.strftime(fmt))


def test_there_are_seventy_templates(templates_dir):
    assert sorted(p.name for p in templates_dir.glob("*.jinja")) == sorted(RENDERS)
    assert len(RENDERS) == 70


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_template_renders_as_transformers(templates_dir, fixed_clock, name):
    source = (templates_dir / name).read_text(encoding="utf-8")
    ref = RENDERS[name]
    assert hashlib.sha256(source.encode()).hexdigest() == ref["sha256"], "not the template the fixture was made from"
    t = ChatTemplate(source, **cases.SPECIAL)
    extra = cases.EXTRA.get(name, {})
    rendered = 0
    for case, (messages, tools) in cases.cases_for(name, source).items():
        want = ref["cases"][case]
        if "text" in want:
            assert t.render(messages, tools=tools, **extra) == want["text"], case
            rendered += 1
        else:  # transformers' render failed: so must ours, as a TemplateError
            with pytest.raises(TemplateError):
                t.render(messages, tools=tools, **extra)
    assert t.supports_system_role == ref["system_role"]
    assert rendered >= 2  # every template renders at least two of the conversations
