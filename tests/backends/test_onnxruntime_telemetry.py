"""ONNX Runtime's telemetry is off (issue 33, item 8).

The pinned onnxruntime writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ on its first
import and, about ten seconds later, resolves its telemetry host from a native thread. A child
process with an empty HOME compiles a tiny causal LM, loads it and generates, then stays alive
past that delay; afterwards HOME must hold nothing and no host name may have been resolved.

Host lookups are caught twice: in Python (socket.getaddrinfo and friends, patched to record and
fail) and, where a C compiler exists, in C (an LD_PRELOAD library whose getaddrinfo and
gethostbyname* record and fail), since the telemetry thread calls libc, never Python. The
preload library proves it is in effect with a canary lookup made through ctypes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORT_DELAY_SECONDS = 15  # the telemetry thread's first lookup came 9 s after the import
CANARY = "canary.dayzero.invalid"

RESOLVER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void record(const char *name) {
    const char *log = getenv("DAYZERO_RESOLVE_LOG");
    if (log == NULL) return;
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    const char *text = name ? name : "(null)";
    (void)!write(fd, text, strlen(text));
    (void)!write(fd, "\n", 1);
    close(fd);
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    record(node);
    return EAI_FAIL;
}

struct hostent *gethostbyname(const char *name) { record(name); return NULL; }
struct hostent *gethostbyname2(const char *name, int af) { record(name); return NULL; }

int gethostbyname_r(const char *name, struct hostent *ret, char *buf, size_t len,
                    struct hostent **result, int *err) {
    record(name); *result = NULL; *err = NO_RECOVERY; return 0;
}

int gethostbyname2_r(const char *name, int af, struct hostent *ret, char *buf, size_t len,
                     struct hostent **result, int *err) {
    record(name); *result = NULL; *err = NO_RECOVERY; return 0;
}
"""

CHILD = textwrap.dedent("""
    import json, socket, sys, time

    resolved = []

    def refuse(name, *args, **kwargs):
        resolved.append(str(name))
        raise socket.gaierror(socket.EAI_FAIL, "host lookups are refused in this test")

    socket.getaddrinfo = refuse
    socket.gethostbyname = refuse
    socket.gethostbyname_ex = refuse

    imported = {}

    def on_import(event, args):
        if event == "import" and args[0] == "onnxruntime" and "at" not in imported:
            imported["at"] = time.monotonic()

    sys.addaudithook(on_import)

    from pathlib import Path
    import numpy as np
    import runtime
    from tests.generation.tiny_lms import compile_lm, prompt, tiny_lm

    out = compile_lm(tiny_lm("llama"), Path(sys.argv[1]) / "lm.dz")
    tokens = runtime.load(out).generate(prompt(5, seed=0).numpy(), max_new_tokens=4,
                                        eos_token_id=[])
    assert tokens.shape == (1, 9), tokens.shape
    assert "at" in imported, "onnxruntime was never imported"
    time.sleep(max(0.0, imported["at"] + float(sys.argv[2]) - time.monotonic()))
    python_lookups = list(resolved)
    if sys.argv[3] == "preload":  # the C library must be in effect: it records this canary
        import ctypes
        res = ctypes.c_void_p()
        ctypes.CDLL(None).getaddrinfo(sys.argv[4].encode(), None, None, ctypes.byref(res))
    print(json.dumps({"python_lookups": python_lookups}))
""")


def preload_library(folder: Path) -> Path | None:
    """The LD_PRELOAD resolver, built here (None without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        return None
    source, library = folder / "resolver.c", folder / "resolver.so"
    source.write_text(RESOLVER)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True, capture_output=True)
    return library


def everything_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
def test_compile_load_and_generate_write_nothing_home_and_resolve_no_host(tmp_path):
    home, work, tools = tmp_path / "home", tmp_path / "work", tmp_path / "tools"
    for folder in (home, work, tools):
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY",
                                                             "LD_PRELOAD")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), PYTHONPATH=str(ROOT))
    library = preload_library(tools)
    log = tools / "resolved.txt"
    if library is not None:
        env.update(LD_PRELOAD=str(library), DAYZERO_RESOLVE_LOG=str(log))
    mode = "preload" if library is not None else "python"
    child = subprocess.run([sys.executable, "-c", CHILD, str(work), str(ORT_DELAY_SECONDS),
                            mode, CANARY], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["python_lookups"] == []
    assert everything_under(home) == []  # no ~/.cache/Microsoft/DeveloperTools/.onnxruntime
    if library is not None:
        assert log.read_text().split() == [CANARY]  # the canary only: no host was resolved
