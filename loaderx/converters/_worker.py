"""``python -m loaderx.converters._worker JOB``: one conversion task in its own
process (started by `loaderx.convert` with ``workers=N``)."""

import sys

from loaderx.converters._run import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
