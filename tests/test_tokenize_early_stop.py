"""Tokenization's worker pool must never hang: an early stop (max_tokens) with chunks in flight
shuts it down, and a worker killed mid-task fails the build with a one-line error.

Each case runs in a child process with a generous deadline, so a hang fails the test instead of
hanging the suite. No timing is asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 240  # generous: a run takes a few seconds even on a busy 2-core machine


def run_child(code: str, tmp_path: Path, returncode: int = 0) -> str:
    script = tmp_path / "child.py"
    # Under a main guard: spawned pool workers re-import the main module.
    body = textwrap.indent(textwrap.dedent(code), "    ")
    script.write_text(f"def main():\n{body}\n\nif __name__ == '__main__':\n    main()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its pool workers
        out, _ = proc.communicate()
        raise AssertionError(f"hung: no exit within {DEADLINE_S} s\n{out[-3000:]}") from None
    assert proc.returncode == returncode, out[-3000:]
    return out


def test_early_stop_while_a_task_is_being_sent_shuts_down(tmp_path):
    # The race that hung `speedgpt train` one build in ~14: the consumer stops while both workers
    # are busy and the pool's task-handler thread is still pickling the next task, which is larger
    # than a pipe holds. A pool terminated then waits forever on that thread's write. Here pickling
    # and the workers' work wait on a flag the consumer sets at its stop, which holds that window
    # open every time instead of by chance.
    flag = tmp_path / "stopped.flag"
    (tmp_path / "slowpickle.py").write_text(textwrap.dedent(f"""
        import multiprocessing
        import os
        import time

        FLAG = {str(flag)!r}

        def wait_for_stop(then_s):
            while not os.path.exists(FLAG):
                time.sleep(0.01)
            time.sleep(then_s)

        def busy_list(items):  # a worker unpickling its task: busy until 3 s after the stop
            if multiprocessing.parent_process() is not None:  # not when the parent drains the pipe
                wait_for_stop(3.0)
            return list(items)

        class BusyInWorker(list):
            def __reduce__(self):
                return (busy_list, (list(self),))

        class SlowToSend(list):
            def __reduce__(self):  # the task-handler thread pickling: done 1 s after the stop
                wait_for_stop(1.0)
                return (list, (list(self),))
    """))
    run_child(f"""
        from pathlib import Path
        from slowpickle import BusyInWorker, SlowToSend
        from speedgpt.data.tokenize_pool import ordered_results

        big = "word " * 200_000  # ~1 MB pickled: more than a pipe holds
        chunks = [(0, ["first"]), (1, BusyInWorker(["a"])), (2, BusyInWorker(["b"])), (3, SlowToSend([big]))]
        chunks += [(i, ["later"]) for i in range(4, 8)]
        with ordered_results(iter(chunks), workers=2) as results:
            for meta, (tokens, lengths, hashes) in results:
                assert meta == 0 and len(lengths) == 1
                Path({str(flag)!r}).touch()
                break  # the early stop, with chunks 1-3 in flight
        print("ok")
    """, tmp_path)


def test_tokenize_corpus_early_stop_repeatedly(tmp_path):
    # The real path a handful of times: max_tokens reached on the first chunk, a dozen behind it.
    run_child("""
        from speedgpt.data.corpus import Documents
        from speedgpt.data.tokenize import tokenize_corpus

        words = " ".join(f"word{i} value_{i % 97} = f({i});" for i in range(12_000))
        texts = [f"doc {i} {words}" for i in range(40)]
        for _ in range(4):
            m = tokenize_corpus(Documents(texts), "out", max_tokens=1000, workers=2, progress=False)
            assert m["stopped_early"] and m["documents"] == 1
    """, tmp_path)


def test_a_worker_killed_mid_task_fails_the_build_with_one_line(tmp_path):
    # multiprocessing.Pool replaced a worker killed with its task and waited for that task forever.
    (tmp_path / "killer.py").write_text(textwrap.dedent("""
        import multiprocessing
        import os
        import signal

        def encode_then_die(texts):  # stands in for encode_chunk
            assert multiprocessing.parent_process() is not None, "only a pool worker may die here"
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
    """))
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"doc{i}.txt").write_text(f"document {i} " * 100)
    out = run_child("""
        import sys
        import speedgpt.data.tokenize_pool as tokenize_pool
        from killer import encode_then_die
        from speedgpt.cli import main

        tokenize_pool.encode_chunk = encode_then_die  # what the parent hands to the workers
        sys.exit(main(["data", "tokenize", "in", "--out", "out", "--workers", "2"]))
    """, tmp_path, returncode=2)
    assert "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(
        "speedgpt data tokenize: error: a tokenizer worker process died mid-task"), out
    assert not list((tmp_path / "out").glob("*.bin")) and not (tmp_path / "out" / "manifest.json").exists()
