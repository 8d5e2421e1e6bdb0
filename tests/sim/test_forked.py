"""Work forked off to a child: its result, its failures, and runs that split off a shared
fleet finished in a child equal the same runs finished in-process.

Forking is only safe in a process with one thread, and a pytest worker has more (which is
why ``spare_cpus`` says 0 there): each test that forks runs its script in a fresh
interpreter (``in_fresh_interpreter``).
"""

from __future__ import annotations

import os

from tests.sim.fresh import in_fresh_interpreter
from tests.tools import require_tool


def test_a_childs_result_comes_back_from_another_process() -> None:
    pids, value = in_fresh_interpreter(
        """
        import json, os
        from cachescale.sim.forked import Forked
        child = Forked(lambda: (os.getpid(), [i * i for i in range(100_000)]))
        pid, squares = child.result()
        print(json.dumps([[os.getpid(), pid], squares[-1]]))
        """
    )
    assert pids[0] != pids[1]
    assert value == 99_999**2


def test_what_a_child_raises_is_raised_in_the_parent_with_its_traceback() -> None:
    message = in_fresh_interpreter(
        """
        import json
        from cachescale.sim.forked import Forked, ForkedError
        def work():
            raise ValueError("the branch broke")
        try:
            Forked(work).result()
        except ForkedError as error:
            print(json.dumps(str(error)))
        """
    )
    assert isinstance(message, str)
    assert message.startswith("a forked child failed:")
    assert "ValueError: the branch broke" in message


def test_a_child_that_ends_without_its_result_says_how_it_ended() -> None:
    messages = in_fresh_interpreter(
        """
        import json, os, signal
        from cachescale.sim.forked import Forked, ForkedError
        said = []
        for work in (lambda: os._exit(3), lambda: os.kill(os.getpid(), signal.SIGKILL)):
            try:
                Forked(work).result()
            except ForkedError as error:
                said.append(str(error))
        print(json.dumps(said))
        """
    )
    assert messages == [
        "a forked child ended without its result (exit code 3)",
        "a forked child ended without its result (killed by signal 9)",
    ]


def test_a_cancelled_child_is_killed_and_reaped() -> None:
    outcome = in_fresh_interpreter(
        """
        import json, os, time
        from cachescale.sim.forked import Forked
        child = Forked(lambda: time.sleep(600))
        pid = child._pid
        started = time.monotonic()
        child.cancel()
        try:
            os.waitpid(pid, os.WNOHANG)
            reaped = False
        except ChildProcessError:
            reaped = True
        print(json.dumps([reaped, time.monotonic() - started < 10]))
        """
    )
    assert outcome == [True, True]


def test_nothing_is_forked_while_another_thread_runs() -> None:
    # Also a thread started outside ``threading`` (as a test runner's I/O thread is); not
    # numpy's native OpenBLAS threads (imported by the simulator itself).
    spare = in_fresh_interpreter(
        """
        import _thread, json, threading
        import numpy
        from cachescale.sim.forked import spare_cpus
        alone = spare_cpus()
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        beside_a_thread = spare_cpus()
        stop.set()
        other.join()
        held, started = _thread.allocate_lock(), _thread.allocate_lock()
        held.acquire()
        started.acquire()
        def wait():
            started.release()
            held.acquire()
        _thread.start_new_thread(wait, ())
        started.acquire()
        beside_a_raw_thread = spare_cpus()
        print(json.dumps([alone, beside_a_thread, beside_a_raw_thread]))
        """
    )
    assert spare == [len(os.sched_getaffinity(0)) - 1, 0, 0]


def test_runs_finished_in_a_child_equal_runs_finished_in_process() -> None:
    # The three runs of test_run.py's split test: the HPA alone and two policies, one
    # workload, fleets that diverge (in replicas and in --max-num-seqs). In-process
    # (processes=1), then with the stream fed by a feeder and a child taking the first
    # run split off.
    require_tool(
        len(os.sched_getaffinity(0)) >= 2, "this machine gives the tests one CPU: nothing forks"
    )
    forks, same = in_fresh_interpreter(
        """
        import hashlib, json
        from cachescale.commands.simulate import build_autoscaler
        from cachescale.sim import drive
        from tests.sim.test_run import fingerprint, short

        base = short("batch-pressure-loop", policy_start_s=0.0)
        capped = base.model_copy(update={"policy": {
            "budget": {"gpuSecondsPer1kRequests": 300},
            "cache": {"onCollapse": "CapAtBudget"},
        }})
        pairs = [(base, "hpa"), (base, "cachescale"), (capped, "cachescale")]
        forks, feeds = [], []
        branch, feed = drive._Branch.__init__, drive.StreamFeed.__init__
        def counted(self, *args):
            forks.append(1)
            branch(self, *args)
        def fed(self, *args, **kwargs):
            feeds.append(1)
            feed(self, *args, **kwargs)
        drive._Branch.__init__, drive.StreamFeed.__init__ = counted, fed

        def made(processes):
            runs = [(s, build_autoscaler(name, s)) for s, name in pairs]
            results = drive.run_together(runs, processes=processes)
            return hashlib.sha256(repr([fingerprint(r) for r in results]).encode()).hexdigest()

        alone = made(1)
        in_process = [len(forks), len(feeds)]
        forked = made(None)
        print(json.dumps([[in_process, [len(forks), len(feeds)]], alone == forked]))
        """
    )
    # In-process: no child, no feed. Then a feeder and one child (which reads its own
    # pipe of the feed from the split on).
    assert forks == [[0, 0], [1, 1]]
    assert same
