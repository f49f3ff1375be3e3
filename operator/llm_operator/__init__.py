"""Elastic LLM Operator: the LLMTrainingJob API, the kopf operator and the `llmjob` CLI."""
