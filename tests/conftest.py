"""Suite-wide settings.

Remote caches get a fixed size: without a ``cache_limit`` a cache leaves 5%
of its file system free and evicts to stay under that, so on a nearly full
disk a warm read fetches again and tests asserting what crosses the network
would fail by where they ran. Tests of limits pass their own; the test of the
free-space rule unsets this."""
import os

os.environ.setdefault("LOADERX_CACHE_LIMIT", "4GiB")
