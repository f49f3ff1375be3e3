"""The LLMTrainingJob API: typed models, CEL rules, CRD generation and validation."""
