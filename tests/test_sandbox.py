"""The sandbox contains what generated code may do."""

import time

from bass.app.evaluation.sandbox import SandboxLimits, humaneval_program, run_program
from bass.app.humaneval_problems import load_problems


def test_canonical_solutions_pass_and_wrong_ones_fail():
    problems = load_problems()[:5]
    for p in problems:
        assert run_program(humaneval_program(p, p["canonical_solution"])).passed, p["task_id"]
    wrong = run_program(humaneval_program(problems[0], "    return None\n"))
    assert not wrong.passed and "AssertionError" in wrong.reason


def test_an_endless_loop_is_killed():
    t0 = time.monotonic()
    out = run_program("while True:\n    pass\n", SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert not out.passed and out.reason == "timeout" and time.monotonic() - t0 < 5


def test_a_child_process_that_outlives_the_program_is_killed_too():
    src = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nwhile True: pass\n"
    t0 = time.monotonic()
    assert run_program(src, SandboxLimits(timeout_s=1.0)).reason == "timeout"
    assert time.monotonic() - t0 < 5


def test_memory_is_limited():
    out = run_program("x = bytearray(2 * 1024 ** 3)\n", SandboxLimits(memory_bytes=512 << 20))
    assert not out.passed and "MemoryError" in out.reason


def test_network_is_unreachable():
    out = run_program("import socket\nsocket.socket().connect(('127.0.0.1', 9))\n")
    assert not out.passed and "network access is disabled" in out.reason
    raw = run_program("import _socket\n_socket.socket().connect(('127.0.0.1', 9))\n")
    assert not raw.passed  # below the guard: refused by the empty network namespace (or nothing listens)


def test_files_stay_in_a_temporary_directory():
    out = run_program("import os\nopen('scratch.txt', 'w').write('x')\nassert os.getcwd().startswith('/tmp')\n")
    assert out.passed


def test_cpu_time_and_file_size_are_limited():
    spin = run_program("while True:\n    pass\n", SandboxLimits(timeout_s=20.0, cpu_s=1))
    assert not spin.passed and spin.reason != "timeout"  # SIGXCPU after a second of CPU, not the wall clock
    big = run_program("open('big.bin', 'wb').write(b'x' * (4 << 20))\n", SandboxLimits(max_file_bytes=1 << 20))
    assert not big.passed
    small = run_program("open('small.bin', 'wb').write(b'x' * (512 << 10))\n", SandboxLimits(max_file_bytes=1 << 20))
    assert small.passed
