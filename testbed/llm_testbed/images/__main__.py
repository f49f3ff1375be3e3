"""``python -m llm_testbed.images build|list``: the image builder without the rest of llmjob."""

import sys

from llm_testbed.images.cli import main

sys.exit(main())
