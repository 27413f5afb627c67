"""The OpenAI room: the frontend app, its protocol, text handling, errors, metrics, request limits, routes."""
