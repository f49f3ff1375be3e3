"""``python -m llm_trainer.live``: one member of a live (non-restarting) training job."""

from llm_trainer.live.driver import main

raise SystemExit(main())
