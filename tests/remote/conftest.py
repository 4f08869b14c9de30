"""The remote tests run against real servers on loopback (moto's S3, a
Range-honouring HTTP server, a fault proxy): every test in this folder is in
the slow tier. (Marked here rather than in test_remote.py, which another
branch is changing: once it is split, a ``pytestmark`` in each file can say
it instead.)"""
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.slow)
