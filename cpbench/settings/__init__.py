"""Settings: the structured schema Hydra checks overrides against, and its conversion into typed,
validated objects that every layer below receives."""
