"""Kubernetes objects from an artifact, their offline validation, and autoscaling replays."""
