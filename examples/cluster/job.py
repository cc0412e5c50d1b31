"""The entry point spark-submit runs: the same CLI as ``python -m spark_driver``."""

import sys

from spark_driver.__main__ import main

sys.exit(main())
