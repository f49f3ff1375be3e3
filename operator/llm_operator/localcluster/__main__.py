"""``python -m llm_operator.localcluster``: the cluster/tools/chaos commands without the rest of llmjob."""

import sys

from llm_operator.localcluster.cli import main

sys.exit(main())
