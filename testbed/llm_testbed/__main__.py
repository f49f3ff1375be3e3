"""``python -m llm_testbed``: ``llmjob`` with the test bed's commands, whether or not the installed metadata
has their entry point yet (a checkout used through ``PYTHONPATH``, or an install older than the entry point).

The test bed imports the operator's CLI, never the other way round (the operator finds the test bed only
through the ``llmjob.commands`` entry point)."""

import sys

from llm_operator.cli import main

from llm_testbed.cli import register

sys.exit(main(plugins=[register]))
