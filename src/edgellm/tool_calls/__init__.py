"""Tool calls: the text formats chat models write them in, parsed back into OpenAI `tool_calls`,
and grammars that make a model write one when it must (tool_choice "required" or a named
function). formats.py holds the one table of formats (how each is detected, its family module,
its reasoning markers); the families: json_calls.py (JSON with a format's own markers around each
call), marked.py (JSON between a marker and an end marker), xml.py, pythonic.py (LFM2), gemma4.py,
harmony.py (gpt-oss), muse.py (Muse Glimmer); turn.py renders a turn. Each family writes calls,
forces them (a grammar) and reads a reply with scan.py's steps; reply.py turns that reading into
OpenAI's deltas and message, streamed or whole (the server, ChatTurn.message,
LLM.create_chat_completion(stream=True)), so a streamed reply adds up to the whole one.

A format is chosen from the chat template's text, as llama.cpp's common/chat.cpp recognises them
(the XML formats, qwen3_coder, seed_oss, glm, minimax_m2, deepseek_v32 / v4, hy3, minicpm5, kimi_k3 and
muse_glimmer, write a text argument as it is and any other as JSON):

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Hermes 2/3, Qwen 2.5/3, SmolLM3 - also
                 llama.cpp's copy of its template, which lists no tools)
    llama3       {"name": ..., "parameters": {...}}, maybe after <|python_tag|>   (Llama 3.1-3.3)
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}]              (Mistral Nemo)
    mistral_args [TOOL_CALLS]name[ARGS]{...}                                  (Mistral Small 3.2, Devstral, Ministral 3)
    functionary  >>>name\\n{...}                                               (Functionary v3.2)
    function_tag <function=name>{...}</function>                              (Functionary v3.1)
    granite      <|tool_call|>[{"name": ..., "arguments": {...}}]             (Granite 3.3)
    deepseek_r1  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
                 (DeepSeek R1 and its distills)
    deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>   (DeepSeek V3.1)
    command_r7b  <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>
                 (Command R7B and Cohere's MoE template; the answer between <|START_RESPONSE|> and <|END_RESPONSE|>)
    apertus      <|tools_prefix|>[{name: {...}}]<|tools_suffix|>              (Apertus; its reasoning between
                 <|inner_prefix|> and <|inner_suffix|>)
    nemotron_v2  <TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>     (Nemotron Nano v2)
    apriel       <tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls> (Apriel 1.6)
    gemma4       <|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>   (Gemma 4: its own notation, gemma4.py;
                 reasoning between <|channel>thought and <channel|>)
    lfm2         <|tool_call_start|>[name(key="value", n=1)]<|tool_call_end|>   (LFM2, LFM2.5: Python calls, pythonic.py)
    command_r_plus  Action:\\n```json\\n[{"tool_name": ..., "parameters": {...}}]```   (Command R+)
    gigachat_v3  <|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": ..., "arguments": {...}}   (GigaChat 3: one call)
    gigachat_v31 <|function_call|>{"name": ..., "arguments": {...}}            (GigaChat 3.1: one call)
    firefunction_v2  functools[{"name": ..., "arguments": {...}}]              (FireFunction v2)
    minimax_m1   <tool_calls>\\n{"name": ..., "arguments": {...}}\\n...</tool_calls>   (MiniMax-M1: a call a line)
    qwen3_coder  <tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
                 (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5)
    seed_oss     <seed:tool_call>\\n<function=name>\\n<parameter=key>value</parameter>\\n</function>\\n</seed:tool_call>   (Seed-OSS)
    deepseek_v32 <｜DSML｜function_calls>\\n<｜DSML｜invoke name="name">\\n<｜DSML｜parameter name="key" string="true">value</｜DSML｜parameter>\\n
                 </｜DSML｜invoke>\\n</｜DSML｜function_calls>   (DeepSeek V3.2; string="false" for a JSON value)
    deepseek_v4  the same in <｜DSML｜tool_calls>                                 (DeepSeek V4)
    hy3          <tool_calls:opensource>\\n<tool_call:opensource>name<tool_sep:opensource>\\n<arg_key:opensource>key</arg_key:opensource>\\n
                 <arg_value:opensource>value</arg_value:opensource>\\n</tool_call:opensource>\\n</tool_calls:opensource>   (Hunyuan 3)
    glm          <tool_call>name\\n<arg_key>key</arg_key>\\n<arg_value>value</arg_value>\\n</tool_call>
                 (GLM-4.5 to 4.7, Ling 3, Laguna, Spark)
    minicpm5     <function name="name"><param name="key">value</param></function>   (MiniCPM 5; text with <, & or a
                 newline in <![CDATA[...]]>)
    kimi_k3      <|open|>tools<|sep|><|open|>call tool="name" index="1"<|sep|><|open|>argument key="key" type="string"<|sep|>
                 value<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>   (Kimi K3; reasoning in its think section)
    minimax_m2   <minimax:tool_call>\\n<invoke name="name">\\n<parameter name="key">value</parameter>\\n</invoke>\\n</minimax:tool_call>
                 (MiniMax-M2; one block may hold several invokes)
    kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
                 (Kimi K2; the number counts the calls)
    solar_open   <|tool_calls|><|tool_call:begin|>id<|tool_call:name|>name<|tool_call:args|>{...}<|tool_call:end|>...
                 (Solar Open; reasoning between <|think|> and <|end|>, the answer after <|content|>)
    gpt_oss      <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}
                 (gpt-oss: OpenAI's harmony messages, harmony.py; analysis is reasoning_content)
    muse_glimmer  to=self<|message|>...<|eom|><|start|>assistant to=name<|message|><atem:function_calls>
                 <atem:invoke name="name"><atem:parameter name="key">value</atem:parameter></atem:invoke></atem:function_calls>
                 (Muse Glimmer: messages by recipient, muse.py; to=self is reasoning_content)
    generic      {"tool_call": {"name": ..., "arguments": {...}}}  or  {"response": "..."}
                 (any other template - Gemma 2, Phi-3.5, RWKV: no tool support in them, llama.cpp reads
                 their replies as content only -: the system message says how to call a tool)

What reaches the template follows what it renders (ChatTemplate.tool_caps, probed): tools it does
not list are listed in the system message, calls and results it drops are written as text.

Reasoning models' <think>...</think> (or a format's own markers: Command R7B's
<|START_THINKING|>...<|END_THINKING|>, ...) is split off as `reasoning_content` (llama.cpp's
--reasoning-format deepseek).

A format's markers stay in the reply's text even where the vocabulary makes them control tokens
(which decoding drops): formats.preserved_markers names them (reasoning tags and answer marks,
and the call markers where the request has tools), Tokenizer.preserved_ids finds their tokens, and
the reply's decoder renders those (llama.cpp's preserved tokens).
"""

from .common import GENERIC, THINK_CLOSE, THINK_OPEN, ToolFormat
from .formats import (FORMATS, answer_grammar, answer_marks, call_grammar, call_or_json_grammar, detect_format, in_answer,
                      preserved_markers, reasoning_tags, split_reasoning, unmarked, write_calls)
from .reply import Reply, open_reply, parse
from .turn import (ChatTurn, check_tools, chosen_tools, describe_tools, prepare_messages, prepare_turn,
                   with_tool_description)

__all__ = ["FORMATS", "GENERIC", "THINK_CLOSE", "THINK_OPEN", "ChatTurn", "Reply", "ToolFormat", "answer_grammar", "answer_marks",
           "call_grammar", "call_or_json_grammar", "check_tools", "chosen_tools", "describe_tools", "detect_format",
           "in_answer", "open_reply", "parse", "prepare_messages", "prepare_turn", "preserved_markers", "reasoning_tags",
           "split_reasoning", "unmarked", "with_tool_description", "write_calls"]
