"""The OpenAI frontend's gateway: API keys hashed at rest, per-key limits and quotas, usage accounting."""
