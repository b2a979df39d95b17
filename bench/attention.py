"""The benchmark lives in the package (``te_compile/cli/benchmark.py``, also ``te-compile bench``)."""

import sys

from te_compile.cli.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
