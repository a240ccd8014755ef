"""Put first on ``PYTHONPATH`` by a test: every Python process of the run (the harness and its ranks)
sees Transformer Engine as installed (version 2.20.2), as on a GPU machine's container, without it
being there. Only this package's host probe is faked; megatron-core still finds no TE."""

from packaging.version import Version

from megatron.bridge.utils import host

FAKE_VERSION = Version("2.20.2")
host._probe_te_version = lambda: FAKE_VERSION
