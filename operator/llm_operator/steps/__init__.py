"""The steps of one reconcile pass, one policy area per module (see ``llm_operator.reconcile.STEPS``)."""
