"""Reference renders of llama.cpp's chat templates (models/templates/*.jinja) by Hugging Face
transformers, for tests/test_chat_templates.py. Run once, in an environment with transformers
(no torch needed) and with edgellm importable only for the llama.cpp sources:

    python -m venv /tmp/tf && /tmp/tf/bin/pip install transformers
    PYTHONPATH=tests /tmp/tf/bin/python scripts/make_template_fixtures.py tests/fixtures/templates/renders.json

Each template is rendered for the conversations in tests/template_cases.py (plain chat, a system
message, and tools with a tool call and its result where the template uses tools) with
transformers' own renderer (transformers.utils.chat_template_utils.render_jinja_template: the
function apply_chat_template calls, with the same sandboxed environment and globals), bos/eos
texts from template_cases.SPECIAL, the extra variables a few templates need (template_cases.EXTRA)
and a fixed clock for strftime_now. For a template without a
system role, the system case is rendered as llama.cpp would send it (the system text folded into
the next message); the fixture says so. A conversation the template itself rejects is recorded
as an error.
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import datetime
from pathlib import Path

import transformers
from transformers.utils import chat_template_utils

import template_cases as cases
from llamacpp_source import models_dir


def render(source: str, messages, tools, extra: dict) -> str:
    out, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=source, add_generation_prompt=True,
        **cases.SPECIAL, **extra)
    return out[0]


def outcome(source: str, messages, tools, extra: dict) -> dict:
    try:
        return {"text": render(source, messages, tools, extra)}
    except Exception as e:  # the template's raise_exception, or a failure inside it
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    out_path = Path(sys.argv[1])
    clock = datetime(*cases.FIXED_DATE)
    # transformers' strftime_now calls its module's datetime.now(): a fixed date keeps renders stable
    chat_template_utils.datetime = type("FixedClock", (), {"now": staticmethod(lambda *a, **k: clock)})
    result = {"transformers": transformers.__version__, "templates": {}}
    for path in sorted((models_dir() / "templates").glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        entry = {"sha256": hashlib.sha256(source.encode()).hexdigest(), "cases": {}}
        extra = cases.EXTRA.get(path.name, {})
        probe = outcome(source, cases.SYSTEM_PROBE, None, extra)
        system_role = cases.PROBE_TEXT in probe.get("text", "")
        entry["system_role"] = system_role
        for name, (messages, tools) in cases.cases_for(path.name, source).items():
            sent = messages if system_role else cases.fold_system(messages)
            entry["cases"][name] = outcome(source, sent, tools, extra)
        result["templates"][path.name] = entry
        print(path.name, {k: ("ok" if "text" in v else v["error"][:60]) for k, v in entry["cases"].items()})
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
