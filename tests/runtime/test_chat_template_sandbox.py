"""Chat templates render in a limited worker process (runtime/generation/chat_template.py).

A template is code from an artifact: rendered in-process, nested range(100000) loops held a
server and 9 GB, and `content * 100000000` aborted it. Each hostile template here must end in a
ChatTemplateError (an InputError) naming the template, within seconds, with the caller's memory
untouched and the next render working; a real template must render exactly as in-process.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from compiler.errors import InputError
from runtime.generation.chat_template import LIMITS, ChatTemplate, ChatTemplateError, Limits

ROOT = Path(__file__).resolve().parents[2]
NAME = "art/tokenizer/chat_template.jinja"
USER = [{"role": "user", "content": "hello"}]
NESTED = "{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}done"

# Llama 3.1's template (tools, a system message, tojson, add_generation_prompt), abridged
LLAMA3 = """{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'ipython'] %}
        {{- raise_exception('roles must be user, assistant or ipython') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
        + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML = """{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}\
{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

CONVERSATION = [
    {"role": "system", "content": "  You answer in one word.  "},
    {"role": "user", "content": "Grüße, 世界! \"quoted\" \\ back"},
    {"role": "assistant", "content": "Hallo."},
    {"role": "user", "content": "And now?\n  {{ not a template }}"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def in_process(source: str, context: dict) -> str:
    """How the runtime rendered before (and transformers renders): the same environment."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent)
    env.globals["raise_exception"] = lambda message: 1 / 0
    return env.from_string(source).render(**context)


@pytest.fixture
def make():
    made = []

    def factory(source: str, limits: Limits = LIMITS, workers: int = 2) -> ChatTemplate:
        made.append(ChatTemplate(source, NAME, limits, workers))
        return made[-1]

    yield factory
    for template in made:
        template.close()


def failure(template: ChatTemplate, context: dict) -> ChatTemplateError:
    with pytest.raises(ChatTemplateError) as caught:
        template.render(context)
    assert isinstance(caught.value, InputError)  # a server's 400
    return caught.value


@pytest.mark.parametrize("source, context", [
    (LLAMA3, {"messages": CONVERSATION, "tools": TOOLS, "date_string": "26 Jul 2024"}),
    (LLAMA3, {"messages": CONVERSATION[1:], "date_string": "1 Jan 2025"}),
    (LLAMA3, {"messages": CONVERSATION, "tools": None, "date_string": "x",
              "add_generation_prompt": False}),
    (CHATML, {"messages": CONVERSATION[1:]}),
    (CHATML, {"messages": CONVERSATION}),
])
def test_a_real_template_renders_exactly_as_in_process(make, source, context):
    context = {"bos_token": "<|begin_of_text|>", "add_generation_prompt": True, **context}
    expected = in_process(source, context)
    assert len(expected) > 100
    assert make(source).render(context) == expected


def test_nested_range_loops_end_in_a_second_of_cpu_and_the_caller_does_not_grow(make):
    # wall_s: on a loaded machine the 5 s wall deadline could end it before 1 s of CPU
    template = make(NESTED, Limits(wall_s=30))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    error = failure(template, {"n": 100000})
    assert "used more than 1 s of CPU" in error.what and NAME in error.what
    assert time.monotonic() - start < 15
    assert template.render({"n": 3}) == "done"  # the worker was killed and restarted
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown_kb < 20_000


def test_output_past_1_mib_is_cut_while_it_streams(make):
    template = make("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
                    "{% endfor %}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert "wrote more than 1 MiB of output" in failure(template, {}).what
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 20_000
    limited = make("{{ 'x' * n }}", Limits(output=1000))
    assert limited.render({"n": 1000}) == "x" * 1000
    assert "more than 1000 bytes of output" in failure(limited, {"n": 1001}).what


def test_a_gigabyte_string_is_a_memory_error_and_the_next_render_works(make):
    template = make("{{ messages[0].content * n }}")
    error = failure(template, {"messages": USER, "n": 100000000})
    assert "needed more than 256 MiB of memory" in error.what and error.where == NAME
    assert template.render({"messages": USER, "n": 2}) == "hellohello"


def test_a_c_level_loop_the_cpu_timer_cannot_interrupt_is_killed_by_rlimit_cpu(make,
                                                                               monkeypatch):
    # `list in list` compares a million rows inside one C call: no bytecode boundary at which
    # the 1 s timer's exception could be raised, so SIGXCPU has to end it
    template = make("{% set row = [0] * 10000 %}{{ (row[1:] + [1]) in [row] * 1000000 }}",
                    Limits(wall_s=60))
    ended = []
    no_reply = ChatTemplate._no_reply
    monkeypatch.setattr(ChatTemplate, "_no_reply",
                        lambda self, reply: ended.append(reply.code) or no_reply(self, reply))
    start = time.monotonic()
    assert "used more than 1 s of CPU" in failure(template, {}).what
    assert ended == [-signal.SIGXCPU] and time.monotonic() - start < 30


@pytest.mark.parametrize("source, said", [
    ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
    ("{% include 'x' %}", "no loader"),
    ("{% extends '/etc/passwd' %}", "no loader"),
    ("{% import 'x' as y %}", "no loader"),
    ("{{ range(10**9)|list }}", "Range too big"),
    ("line one\n{{ messages.x.y }}", "UndefinedError"),
    ("{{ ''.__class__.__mro__ }}", "__class__"),
    ("{% for m in messages %}", "does not parse"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
])
def test_template_errors_are_clean_errors_naming_the_template(make, source, said):
    template = make(source)
    error = failure(template, {"messages": USER})
    assert said in error.what and NAME in error.what and error.where.startswith(NAME)
    assert "recompile" in error.fix
    (worker,) = template._idle  # the worker caught the error itself: it stays in use
    failure(template, {"messages": USER})
    assert template._idle == [worker] and worker.alive()


def test_an_error_names_the_template_line():
    with ChatTemplate("a\nb\n{{ 1/0 }}", NAME) as template:
        assert failure(template, {}).where == f"{NAME}, line 3"


def test_raise_exception_refuses_the_messages(make):
    template = make("{% if messages[0].role != 'system' %}"
                    "{{ raise_exception('a system message must come first') }}{% endif %}ok")
    error = failure(template, {"messages": USER})
    assert "refused the messages: a system message must come first" in error.what
    assert NAME in error.what and error.where == "messages"
    assert template.render({"messages": [{"role": "system", "content": ""}]}) == "ok"


def test_messages_that_are_not_json_data_are_refused_before_any_render(make):
    error = failure(make("{{ messages }}"), {"messages": [{"role": "user", "content": object()}]})
    assert error.where == "messages" and "object is not JSON" in error.what


def test_a_stopped_worker_is_killed_at_the_wall_deadline_and_replaced(make):
    template = make("{{ n }}", Limits(wall_s=1))
    assert template.render({"n": 1}) == "1"
    (worker,) = template._idle
    os.kill(worker.proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    assert "took more than 1 s" in failure(template, {"n": 2}).what
    assert time.monotonic() - start < 3
    assert worker.proc.returncode == -signal.SIGKILL
    assert template.render({"n": 3}) == "3"


def test_close_abandons_a_render_in_another_thread_at_once(make):
    template = make(NESTED, Limits(cpu_s=60, wall_s=60))
    outcome = []

    def render():
        try:
            outcome.append(template.render({"n": 100000}))
        except ChatTemplateError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=render)
    thread.start()
    deadline = time.monotonic() + 20
    while not (template._busy and next(iter(template._busy)).proc) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the worker is inside the loops now
    start = time.monotonic()
    template.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - start < 2
    assert isinstance(outcome[0], ChatTemplateError) and "closed" in outcome[0].what
    assert "closed" in failure(template, {"n": 1}).what


def test_threads_render_at_once_through_a_small_pool(make):
    template = make(CHATML, workers=2)
    contexts = [{"messages": [{"role": "user", "content": f"question {i}"}],
                 "add_generation_prompt": True} for i in range(12)]
    results: dict[int, str] = {}

    def render(i):
        results[i] = template.render(contexts[i])

    threads = [threading.Thread(target=render, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {i: in_process(CHATML, contexts[i]) for i in range(12)}
    assert len(template._idle) <= 2


@pytest.mark.parametrize("busy", [False, True])
def test_the_process_exits_promptly_and_leaves_no_worker(tmp_path, busy):
    """Without close(): an idle worker, or one inside an endless render in a daemon thread."""
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(ROOT)!r})
        from runtime.generation.chat_template import ChatTemplate, Limits
        template = ChatTemplate({NESTED!r}, "t", Limits(cpu_s=600, wall_s=600))
        assert template.render({{"n": 2}}) == "done"
        print(template._idle[0].proc.pid, flush=True)
        if {busy}:
            threading.Thread(target=template.render, args=({{"n": 100000}},),
                             daemon=True).start()
            time.sleep(0.5)
    """))
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 30
    pid = int(done.stdout.split()[0])
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text(
    ).split()[2]


def test_a_forked_child_starts_its_own_worker_and_leaves_the_parents_alone(make):
    template = make("{{ n }}")
    assert template.render({"n": 1}) == "1"
    (worker,) = template._idle
    pid = os.fork()
    if pid == 0:  # the child: the inherited worker's pipes are the parent's
        ok = template.render({"n": 2}) == "2" and template._idle[0] is not worker
        template.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert template.render({"n": 3}) == "3" and template._idle == [worker] and worker.alive()


def test_descriptors_past_1024_are_waited_on(make):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} open files here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # a busy server's sockets
    try:
        template = make("{{ n }}")
        assert template.render({"n": 7}) == "7"
        assert template._idle[0].proc.stdout.fileno() > 1024
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_oversized_templates_and_messages_are_refused_before_any_render(make, monkeypatch):
    from runtime.generation import chat_template

    monkeypatch.setattr(chat_template, "MAX_REQUEST", 1000)
    template = make("{{ messages[0].content }}")
    assert template.render({"messages": [{"content": "x" * 900}]}) == "x" * 900
    error = failure(template, {"messages": [{"content": "x" * 1000}]})
    assert error.what == "the messages are more than 1000 bytes as JSON"
    monkeypatch.setattr(chat_template, "MAX_TEMPLATE", 10)
    assert "is larger than 10 bytes" in failure(make("{{ 'x' }} 12345"), {}).what
