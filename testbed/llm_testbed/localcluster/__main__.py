"""``python -m llm_testbed.localcluster``: the cluster/tools/chaos commands without the rest of llmjob."""

import sys

from llm_testbed.localcluster.cli import main

sys.exit(main())
