"""``python -m llm_testbed.release`` (``make release``)."""

import sys

from llm_testbed.release.cli import main

sys.exit(main())
