"""Events of a torch profiler Chrome trace, for the tests that build synthetic traces."""


def kernel(name, ts, dur, stream):
    """A GPU kernel on ``stream``."""
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 0,
        "tid": stream,
        "args": {"stream": stream, "device": 0},
    }


def step(n, ts, dur):
    """The profiler's mark of step ``n`` on the host."""
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1, "tid": 1}
